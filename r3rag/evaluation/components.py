"""Build what a method runs on: the policy backend and the retriever, from the config.

Retrievers, first match wins:

1. ``retriever.urls``: the HTTP retrieval service, through :class:`RetrievalClient`;
2. ``retriever.index_dir``: an index searched in-process (no server);
3. the embedded world with neither: a BM25 index of the world corpus, built once into
   ``<world_dir>/index_bm25`` and searched in-process, so ``--dataset world`` works alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from r3rag.errors import ConfigError
from r3rag.evaluation.config import ModelConfig, RetrieverConfig
from r3rag.evaluation.datasets import ResolvedDataset
from r3rag.rollout.backends.base import PolicyBackend
from r3rag.rollout.retriever import Retriever

if TYPE_CHECKING:
    from r3rag.precision import Precision

WORLD_INDEX = "index_bm25"


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


_LOADED: dict[str, PolicyBackend] = {}

#: backends whose weights this process (or its vLLM engine) loads, so their precision is ours to pick
LOCAL_BACKENDS = ("hf", "vllm", "vllm_async")


def model_precision(cfg: ModelConfig) -> Precision | None:
    """The precision a local model runs in, by the one rule (``model.dtype``: auto, float32, bfloat16,
    float16); None for a model behind a URL or a policy without weights."""
    if cfg.backend not in LOCAL_BACKENDS or is_url(cfg.path):
        return None
    from r3rag.machine import resolve_device
    from r3rag.precision import choose_precision

    # the device first: a GPU asked for on a machine without one is resolve_device's one-line error
    device = resolve_device(cfg.device, note=lambda line: None) if cfg.backend == "hf" else "auto"  # vLLM: its GPU, else the CPU
    return choose_precision(cfg.dtype, device)


def load_backend(cfg: ModelConfig) -> PolicyBackend:
    """The policy: an HF model (folder, .gguf, 'smollm2'), a vLLM engine, or an OpenAI-compatible URL.

    An HF model is kept for the life of the process, keyed by its settings, so several runs in one
    process (the quickstart's methods) load it once. (HTTP backends hold an event-loop-bound client
    and are built afresh.)"""
    if cfg.backend != "hf" or is_url(cfg.path):
        return _load_backend(cfg)
    key = cfg.model_dump_json()
    if key not in _LOADED:
        _LOADED[key] = _load_backend(cfg)
    return _LOADED[key]


def _load_backend(cfg: ModelConfig) -> PolicyBackend:
    from r3rag.rollout.backends.registry import get_backend

    if cfg.backend == "openai" or is_url(cfg.path):
        base_url = cfg.base_url or (cfg.path if is_url(cfg.path) else None)
        if base_url is None:
            raise ConfigError("model.backend openai needs model.base_url (or a URL as --model)")
        tok_src = cfg.tokenizer or (None if is_url(cfg.path) else cfg.path)
        if tok_src is None:
            raise ConfigError("an OpenAI-compatible model needs model.tokenizer (a local tokenizer folder or .gguf)")
        from r3rag.rollout.backends.hf_loading import load_tokenizer

        # `vllm serve ORG/NAME` serves the model under its hub id: with --model ORG/NAME (a hub id or
        # folder, not a URL) that is the name asked for and the tokenizer loaded, unless set apart
        api_model = cfg.path if cfg.api_model == "default" and not is_url(cfg.path) else cfg.api_model
        return get_backend("openai", base_url=base_url, model=api_model, tokenizer=load_tokenizer(tok_src))
    if cfg.backend == "hf":
        from r3rag.machine import resolve_device

        return get_backend("hf", model=cfg.path, dtype=model_precision(cfg).torch_name, device=resolve_device(cfg.device),
                           max_batch_size=cfg.max_batch_size,
                           shared_prefix_tokens=cfg.shared_prefix_tokens, inline=True)  # batch work: generate on the loop's thread (HFBackend.inline)
    if cfg.backend in ("vllm", "vllm_async"):
        return get_backend(cfg.backend, model=cfg.path, dtype=model_precision(cfg).torch_name, **cfg.engine_kwargs)
    return get_backend(cfg.backend, model=cfg.path)


def world_index(world_dir: str | Path, show_progress: bool = False) -> Path:
    """A BM25 index of the world corpus in ``world_dir/index_bm25`` (built on first use)."""
    from r3rag.retrieval.manifest import MANIFEST_NAME

    out = Path(world_dir) / WORLD_INDEX
    if not (out / MANIFEST_NAME).is_file():
        from r3rag.retrieval.bm25_index import build_bm25

        build_bm25(Path(world_dir) / "corpus.jsonl", out, name="world", show_progress=show_progress)
    return out


def load_retriever(cfg: RetrieverConfig, dataset: ResolvedDataset) -> Retriever:
    if cfg.urls:
        from r3rag.retrieval.client import RetrievalClient

        return RetrievalClient(cfg.urls, timeout=cfg.timeout_s, retries=cfg.retries)
    index_dir = cfg.index_dir
    if index_dir is None and dataset.world_dir is not None:
        index_dir = str(world_index(dataset.world_dir))
    if index_dir is None:
        raise ConfigError(
            f"dataset {dataset.name!r} needs a retriever: pass --retriever-url URL (tool/retrieval_server.py) "
            "or --set retriever.index_dir=DIR"
        )
    from r3rag.retrieval.manifest import read_manifest
    from r3rag.retrieval.searcher import load_searcher
    from r3rag.rollout.retriever import SearcherRetriever

    # numba's first BM25 search compiles for ~20 s; numpy is instant and fast enough in-process
    opts = {"backend": cfg.bm25_backend} if read_manifest(Path(index_dir)).method == "bm25" else {}
    return SearcherRetriever(load_searcher(index_dir, **opts))


def prepare_world(work: str | Path, seed: int = 0, size: str = "small") -> tuple[Path, Path]:
    """``(world_dir, bm25_index_dir)`` of the embedded world under ``work/world-SIZE-SEED``, built
    on first use and reused afterwards (benchmarks and tests that need a world plus its index)."""
    from r3rag.evaluation.datasets import ensure_world

    world = ensure_world(Path(work) / f"world-{size}-{seed}", seed=seed, size=size)
    return world, world_index(world)

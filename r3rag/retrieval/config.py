"""Settings of the retrieval service (``--config``/``--set`` on tool/retrieval_server.py)."""

from __future__ import annotations

from r3rag.config import Section


class ServiceConfig(Section):
    host: str = "127.0.0.1"
    port: int = 8000
    default_index: str | None = None
    """Index answering requests that name none (default: the hybrid one if built, else the first)."""
    hybrid: bool = False
    """Also serve ``hybrid``: reciprocal rank fusion of all loaded indexes."""
    rrf_k: float = 60.0
    hybrid_depth: int = 50
    reranker: str | None = None
    """A cross-encoder folder; when set, every index is reranked over ``rerank_depth`` candidates."""
    rerank_depth: int = 20
    microbatch: bool = True
    batch_window_ms: float = 2.0
    max_batch_queries: int = 64
    """Queries per search batch (strict: a request that would exceed it starts the next batch)."""
    cache_size: int = 100_000
    """Entries of the (index, query, k) LRU cache; 0 disables it."""
    max_queries_per_request: int = 512
    max_query_chars: int = 4096
    max_topk: int = 200
    default_topk: int = 5
    max_body_bytes: int = 4 * 1024 * 1024
    ef_search: int | None = None
    nprobe: int | None = None
    bm25_backend: str | None = None
    """bm25s backend: numba (compiled, fastest; compiles for a few seconds at start), numpy, or auto."""
    bm25_mmap: bool = False
    """Memory-map the BM25 score matrix instead of loading it (large corpora, less resident memory)."""
    device: str | None = None
    torch_threads: int | None = None
    log_level: str = "warning"

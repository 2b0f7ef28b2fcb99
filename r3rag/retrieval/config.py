"""Settings of the retrieval service (``--config``/``--set`` on tool/retrieval_server.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from r3rag.config import Section

NonNegative = Annotated[int, Field(ge=0)]


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
    max_queue: NonNegative = 256
    """Requests each index may hold, waiting for or in a search; past it a request gets 503 with
    ``Retry-After`` at once (cache hits are never refused). 0: unbounded."""
    retry_after_s: NonNegative = 1
    """Seconds sent in ``Retry-After`` with those 503s (HTTP wants whole seconds)."""
    limit_concurrency: NonNegative | None = 1024
    """uvicorn's cap on open connections plus in-flight requests; past it uvicorn itself answers a
    plain 503 to every path, /health included, so keep it well above the expected clients.
    0 or null: no cap."""
    offload_bytes: NonNegative = 256 * 1024
    """Request bodies and responses of at least this many bytes are decoded / rendered and encoded
    on the codec threads instead of the event loop. 0: never."""
    codec_threads: Annotated[int, Field(ge=1)] = 2
    """Threads that decode and encode large bodies."""
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
    faiss_gpu: bool = False
    """Copy every dense index to all visible GPUs (sharded, fp16) with faiss-gpu; a one-line error
    where faiss sees no GPU."""
    dense_mmap: bool = True
    """Memory-map dense index files (faiss IO_FLAG_MMAP_IFC) instead of reading them into memory."""
    refine_k: int | None = None
    """Candidates re-scored exactly from the stored fp16 vectors (default: the index's manifest)."""
    dense_encoder: str | None = None
    """Serve dense indexes with this encoder folder instead of the one named in the manifest (it
    must reproduce the manifest's probe vectors, else the server refuses to start)."""
    device: str | None = None
    torch_threads: int | None = None
    log_level: str = "warning"

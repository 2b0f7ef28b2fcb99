"""The retrieval HTTP service (FastAPI): several dialects, micro-batching, a cache, hard limits.

:func:`create_app` serves a dict of named searchers. Every search endpoint reads the body
itself (capped at ``max_body_bytes``, strict UTF-8, JSON), lets its dialect validate it, looks
each query up in the (index, query, k) LRU cache, sends the misses through the index's
:class:`~r3rag.retrieval.batcher.MicroBatcher` (which runs the CPU-bound search on a worker
thread, batched with whatever else arrived) and renders the answer in the dialect's shape.
Bad input is a 4xx JSON ``{"error": message}``; nothing a client sends can produce a stack
trace. ``GET /health`` and ``GET /stats`` never touch the search threads.

Under load the service sheds instead of queueing without end. Each index's batcher holds at most
``max_queue`` requests (waiting or being searched); a request past that is answered at once with
``503`` and a ``Retry-After`` header (``retry_after_s``) and a JSON ``{"error", "status",
"retry_after_s"}`` naming the index and the bound, which :class:`RetrievalClient` honours before
retrying. Cache hits never reach a batcher and are never shed. uvicorn's own
``limit_concurrency`` (connections plus in-flight requests) is set from the config as the outer
guard; past it uvicorn answers a plain 503, for every path including ``/health``, so it is set
well above any expected client count. Request bodies and rendered responses larger than
``offload_bytes`` are decoded and encoded on a small ``codec_threads`` pool, the response in one
piece per result row, so the event loop (and ``/health``) gets the GIL between pieces instead of
waiting for a whole multi-megabyte body.

:func:`serve_in_thread` runs the service on a free port in a background thread and returns
once ``/health`` answers: the way tests and scripts get a live server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from r3rag.data.records import Passage
from r3rag.errors import R3RagError
from r3rag.retrieval.batcher import MicroBatcher, Overloaded
from r3rag.retrieval.cache import LRUCache
from r3rag.retrieval.config import ServiceConfig
from r3rag.retrieval.dialects import DIALECTS, BadRequest, Dialect, Limits
from r3rag.retrieval.searcher import Searcher
from r3rag.retrieval.stats import ServiceStats

try:  # orjson serialises large result lists several times faster than the standard library
    from orjson import dumps as _orjson_dumps
except ImportError:  # pragma: no cover - depends on the environment
    _orjson_dumps = None


def _dumps(value: Any) -> bytes:
    if _orjson_dumps is not None:
        return _orjson_dumps(value)
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def json_response(payload: Any) -> Response:
    """A 200 JSON response, serialised with orjson when it is installed."""
    if _orjson_dumps is None:
        return JSONResponse(payload)
    return Response(content=_orjson_dumps(payload), media_type="application/json")


def encode_payload(payload: Any) -> bytes:
    """JSON bytes of ``payload``, the same as one ``dumps`` call, but made one element at a time
    for a top-level list and for the lists directly under a top-level object (one result row per
    call): between the pieces the worker thread running this gives the GIL back to the loop. The
    pieces are joined once (a 60 MB answer is copied once, not once per nesting level)."""
    out: list[bytes] = []

    def put(v: Any) -> None:
        if not isinstance(v, list):
            out.append(_dumps(v))
            return
        out.append(b"[")
        for i, x in enumerate(v):
            if i:
                out.append(b",")
            out.append(_dumps(x))
        out.append(b"]")

    if isinstance(payload, dict):
        out.append(b"{")
        for i, (k, v) in enumerate(payload.items()):
            out.append((b"," if i else b"") + _dumps(str(k)) + b":")
            put(v)
        out.append(b"}")
    else:
        put(payload)
    return b"".join(out)


def decode_body(raw: bytes) -> Any:
    """A request body parsed as JSON, or :class:`BadRequest` saying what is wrong with it."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(400, f"request body is not valid UTF-8 (bad byte at offset {err.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BadRequest(400, f"request body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    except RecursionError:
        raise BadRequest(400, "request body is not valid JSON: nested too deeply") from None


def render_and_encode(dialect: Dialect, req: Any, results: list[list[Passage]]) -> bytes:
    return encode_payload(dialect.render(req, results))


def response_size_at_least(results: list[list[Passage]], threshold: int) -> bool:
    """Whether the rendered answer will be about ``threshold`` bytes or more; ``threshold`` 0:
    never. Cheap on the loop: every passage costs at least ~64 bytes of JSON, so characters are
    only counted when there are fewer than ``threshold / 64`` passages."""
    if threshold <= 0:
        return False
    n = sum(len(ps) for ps in results)
    if n * 64 >= threshold:
        return True
    return sum(len(p.contents) + 64 for ps in results for p in ps) >= threshold


log = logging.getLogger("r3rag.retrieval.service")


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "status": status}, status_code=status)


def overloaded_response(err: Overloaded, retry_after_s: int) -> JSONResponse:
    """503 with ``Retry-After``: the index's queue is full; nothing was queued."""
    return JSONResponse(
        {"error": f"{err}; retry after {retry_after_s} s", "status": 503, "retry_after_s": retry_after_s},
        status_code=503, headers={"Retry-After": str(retry_after_s)},
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The raw request body, at most ``limit`` bytes (413 past it, 400 when empty)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(400, f"invalid Content-Length header {declared!r}")
        if int(declared) > limit:
            raise BadRequest(413, f"request body is {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        raise BadRequest(400, "request body is empty; expected a JSON object")
    return raw


async def read_json(request: Request, limit: int, offload: "Runtime | None" = None) -> Any:
    """The request body parsed as JSON (on ``offload``'s codec pool when it is large)."""
    raw = await read_body(request, limit)
    if offload is not None and 0 < offload.cfg.offload_bytes <= len(raw):
        return await offload.offload(decode_body, raw)
    return decode_body(raw)


class Runtime:
    """The searchers, their batchers, the cache and the counters of one running service."""

    def __init__(self, searchers: dict[str, Searcher], cfg: ServiceConfig) -> None:
        if not searchers:
            raise R3RagError("the service needs at least one index")
        self.searchers = searchers
        self.cfg = cfg
        self.default = cfg.default_index or ("hybrid" if "hybrid" in searchers else next(iter(searchers)))
        if self.default not in searchers:
            raise R3RagError(f"default index {self.default!r} is not loaded; loaded: {', '.join(searchers)}")
        self.batchers = {
            name: MicroBatcher(s, window_s=cfg.batch_window_ms / 1000.0, max_batch=cfg.max_batch_queries,
                               enabled=cfg.microbatch, max_queue=cfg.max_queue)
            for name, s in searchers.items()
        }
        self.codec = ThreadPoolExecutor(max_workers=max(1, cfg.codec_threads), thread_name_prefix="codec")
        self.offloaded = 0  # bodies decoded or responses encoded on the codec pool
        self.cache: LRUCache[list[Passage]] = LRUCache(cfg.cache_size)
        self.stats = ServiceStats()
        self.limits = Limits(cfg.max_queries_per_request, cfg.max_query_chars, cfg.max_topk, cfg.default_topk)
        self.started = time.time()

    async def search(self, index: str, queries: list[str], k: int) -> tuple[list[list[Passage]], int, int]:
        """Results per query, plus the number of cache hits and misses."""
        keys = [(index, q, k) for q in queries]
        results: list[list[Passage] | None] = [self.cache.get(key) for key in keys]
        missing = [i for i, r in enumerate(results) if r is None]
        if missing:
            found = await self.batchers[index].search([queries[i] for i in missing], k)
            if len(found) != len(missing):
                raise RuntimeError(f"searcher {index!r} returned {len(found)} result lists for {len(missing)} queries")
            for i, ps in zip(missing, found):
                results[i] = ps
                self.cache.put(keys[i], ps)
        return results, len(queries) - len(missing), len(missing)  # type: ignore[return-value]

    async def offload(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the codec pool, off the event loop."""
        self.offloaded += 1
        return await asyncio.get_running_loop().run_in_executor(self.codec, fn, *args)

    async def aclose(self) -> None:
        for b in self.batchers.values():
            await b.aclose()
        self.codec.shutdown(wait=False)

    def stats_snapshot(self) -> dict:
        snap = self.stats.snapshot()
        batches = sum(b.batches for b in self.batchers.values())
        batched = sum(b.batched_queries for b in self.batchers.values())
        snap.update(
            uptime_s=round(time.time() - self.started, 3),
            cache_size=len(self.cache),
            cache_capacity=self.cache.capacity,
            batches=batches,
            mean_batch_queries=round(batched / batches, 3) if batches else None,
            microbatch=self.cfg.microbatch,
            queue={name: {"pending": b.pending, "max_queue": b.max_queue, "shed": b.shed}
                   for name, b in self.batchers.items()},
            offloaded=self.offloaded,
            indexes={name: s.describe() for name, s in self.searchers.items()},
            default_index=self.default,
        )
        return snap


def create_app(searchers: dict[str, Searcher], cfg: ServiceConfig | None = None) -> FastAPI:
    """A FastAPI app serving ``searchers`` by name with the dialects in :data:`DIALECTS`."""
    cfg = cfg or ServiceConfig()
    rt = Runtime(searchers, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await rt.aclose()

    app = FastAPI(title="r3rag retrieval service", lifespan=lifespan)
    app.state.runtime = rt

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        rt.stats.record_error(exc.status_code)
        hint = f"; endpoints: GET /health, GET /stats, POST {', POST '.join(DIALECTS)}" if exc.status_code in (404, 405) else ""
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}{hint}")

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:  # pragma: no cover - defensive
        rt.stats.record_error(500)
        log.exception("internal error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}")

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "indexes": list(rt.searchers), "default_index": rt.default}

    @app.get("/stats")
    async def stats() -> dict:
        return rt.stats_snapshot()

    def add_dialect(d: Dialect) -> None:
        async def endpoint(request: Request) -> JSONResponse:
            t0 = time.perf_counter()
            try:
                body = await read_json(request, cfg.max_body_bytes, rt)
                req = d.parse(body, rt.limits)
                index = req.index or rt.default
                if index not in rt.searchers:
                    raise BadRequest(404, f"unknown index {index!r}; this server has: {', '.join(rt.searchers)}")
                results, hits, misses = await rt.search(index, req.queries, req.k)
                if response_size_at_least(results, cfg.offload_bytes):
                    content = await rt.offload(render_and_encode, d, req, results)
                    response = Response(content=content, media_type="application/json")
                else:
                    response = json_response(d.render(req, results))
            except BadRequest as err:
                rt.stats.record_error(err.status)
                return error_response(err.status, err.message)
            except Overloaded as err:
                rt.stats.record_error(503)
                return overloaded_response(err, cfg.retry_after_s)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a search failure is a 500 with one line, never a trace
                rt.stats.record_error(500)
                log.exception("search failed on %s", d.path)
                return error_response(500, f"search failed: {type(err).__name__}: {err}")
            rt.stats.record_request(d.path, len(req.queries), time.perf_counter() - t0, hits, misses)
            return response

        endpoint.__name__ = f"post_{d.path.strip('/')}"
        app.post(d.path, summary=f"search ({d.client} dialect)")(endpoint)

    for d in DIALECTS.values():
        add_dialect(d)
    return app


def load_searchers(index_dirs: list[str | Path], cfg: ServiceConfig | None = None) -> dict[str, Searcher]:
    """Open each index directory (``NAME=DIR`` renames it) and add hybrid/reranking per ``cfg``."""
    from r3rag.retrieval.hybrid import HybridSearcher
    from r3rag.retrieval.searcher import load_searcher

    cfg = cfg or ServiceConfig()
    searchers: dict[str, Searcher] = {}
    for spec in index_dirs:
        spec = str(spec)
        name, _, path = spec.rpartition("=") if "=" in spec else ("", "", spec)
        opts = {k: v for k, v in (("ef_search", cfg.ef_search), ("nprobe", cfg.nprobe), ("device", cfg.device),
                                  ("backend", cfg.bm25_backend), ("bm25_mmap", cfg.bm25_mmap or None),
                                  ("dense_mmap", cfg.dense_mmap), ("faiss_gpu", cfg.faiss_gpu or None),
                                  ("refine_k", cfg.refine_k), ("encoder", cfg.dense_encoder)) if v is not None}
        s = load_searcher(path, **opts)
        s.name = name or s.name
        if s.name in searchers:
            raise R3RagError(f"two indexes are named {s.name!r}; rename one with --index NAME=DIR")
        searchers[s.name] = s
    if cfg.reranker:
        from r3rag.retrieval.rerank import CrossEncoder, RerankedSearcher

        ce = CrossEncoder(cfg.reranker, device=cfg.device)
        searchers = {n: RerankedSearcher(s, ce, cfg.rerank_depth) for n, s in searchers.items()}
    if cfg.hybrid:
        if len(searchers) < 2:
            raise R3RagError("--hybrid needs at least two indexes (e.g. one bm25 and one dense)")
        searchers["hybrid"] = HybridSearcher(list(searchers.values()), rrf_k=cfg.rrf_k, depth=cfg.hybrid_depth)
    return searchers


class ServerHandle:
    """A server running in a background thread: ``url``, ``stop()``; also a context manager."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int, app: FastAPI) -> None:
        self.server, self.thread, self.host, self.port, self.app = server, thread, host, port, app
        self.url = f"http://{host}:{port}"

    @property
    def runtime(self) -> Runtime:
        return self.app.state.runtime

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> "ServerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_app_in_thread(app: FastAPI, host: str = "127.0.0.1", port: int = 0, startup_timeout: float = 60.0,
                        limit_concurrency: int | None = None) -> ServerHandle:
    """Run ``app`` with uvicorn on ``host:port`` (0 = a free port) and wait until /health answers.

    ``limit_concurrency`` defaults to the retrieval runtime's ``ServiceConfig.limit_concurrency``
    when ``app`` is a retrieval service, else uvicorn's default (none)."""
    import httpx
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    port = sock.getsockname()[1]
    if limit_concurrency is None and isinstance(getattr(app.state, "runtime", None), Runtime):
        limit_concurrency = app.state.runtime.cfg.limit_concurrency
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False, backlog=2048,
                            limit_concurrency=limit_concurrency or None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name=f"retrieval-{port}")
    thread.start()
    handle = ServerHandle(server, thread, host, port, app)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise R3RagError(f"retrieval server on {host}:{port} exited during start-up")
        try:
            if httpx.get(f"{handle.url}/health", timeout=2.0).status_code == 200:
                return handle
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    handle.stop()
    raise R3RagError(f"retrieval server on {host}:{port} did not answer /health within {startup_timeout:.0f} s")


def serve_in_thread(
    index_dirs: list[str | Path] | str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    searchers: dict[str, Searcher] | None = None,
    **opts: Any,
) -> ServerHandle:
    """Load ``index_dirs`` (or use ready ``searchers``) and serve them in a background thread.

    ``opts`` are :class:`ServiceConfig` fields (``microbatch=False``, ``cache_size=0``, ...).
    """
    cfg = ServiceConfig(host=host, port=port, **opts)
    if searchers is None:
        dirs = [index_dirs] if isinstance(index_dirs, (str, Path)) else list(index_dirs)
        searchers = load_searchers(dirs, cfg)
    return serve_app_in_thread(create_app(searchers, cfg), host, port)

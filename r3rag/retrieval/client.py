"""The retrieval client: the only way the rest of r3rag reaches a retriever.

``RetrievalClient(urls).search(queries, k) -> list[list[Passage]]`` (and ``await asearch``)
speaks the ``/retrieve`` dialect with scores. Requests go round-robin over the server URLs
(one replica per node on a cluster). A connection error, timeout, 5xx or 429 is retried on
the *next* URL after an exponential back-off with jitter
(``backoff * 2**attempt * uniform(0.5, 1.5)``, capped at ``max_backoff``); a 4xx is the
caller's mistake and raises at once. When the retries run out, :class:`RetrievalError` is
raised, so a caller can record a failed retrieval instead of silently using zero documents.
A response whose shape or length does not match the request is an error too, never an empty
result.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
from typing import Any, Coroutine, TypeVar

import httpx

from r3rag.data.records import Passage
from r3rag.errors import R3RagError

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class RetrievalError(R3RagError):
    """Retrieval failed: retries exhausted, a 4xx answer, or a malformed response."""

    def __init__(self, message: str, status: int | None = None, attempts: int = 0) -> None:
        super().__init__(message)
        self.status = status
        self.attempts = attempts


class RetrievalClient:
    def __init__(
        self,
        urls: list[str] | str,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        index: str | None = None,
        max_queries_per_request: int = 256,
        seed: int | None = None,
    ) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise R3RagError("RetrievalClient needs at least one server URL")
        self.urls = [u.rstrip("/") for u in urls]
        self.timeout = timeout
        self.retries = max(0, retries)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.index = index
        self.max_queries_per_request = max(1, max_queries_per_request)
        self._rr = itertools.count()
        self._rng = random.Random(seed)
        self._clients: dict[int, httpx.AsyncClient] = {}
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        self._sync_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- async API ---------------------------------------------------------------------
    def _client(self) -> httpx.AsyncClient:
        key = id(asyncio.get_running_loop())
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = httpx.AsyncClient(
                timeout=self.timeout, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)
            )
        return client

    def delay(self, attempt: int) -> float:
        """Back-off before retry number ``attempt`` (0-based), with +-50 % jitter."""
        return min(self.max_backoff, self.backoff * (2**attempt)) * self._rng.uniform(0.5, 1.5)

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        start = next(self._rr)
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            url = self.urls[(start + attempt) % len(self.urls)] + path
            try:
                resp = await self._client().request(method, url, json=payload)
            except httpx.TransportError as err:
                last = f"{url}: {type(err).__name__}: {err}"
            else:
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError:
                        raise RetrievalError(f"{url}: response is not JSON", resp.status_code, attempt + 1) from None
                message = _error_message(resp)
                if resp.status_code not in RETRY_STATUS:
                    raise RetrievalError(f"{url}: HTTP {resp.status_code}: {message}", resp.status_code, attempt + 1)
                last = f"{url}: HTTP {resp.status_code}: {message}"
            if attempt < self.retries:
                await asyncio.sleep(self.delay(attempt))
        raise RetrievalError(f"retrieval failed after {self.retries + 1} attempts; last: {last}", attempts=self.retries + 1)

    async def _search_chunk(self, queries: list[str], k: int) -> list[list[Passage]]:
        payload: dict[str, Any] = {"queries": queries, "topk": k, "return_scores": True}
        if self.index:
            payload["index"] = self.index
        data = await self._request("POST", "/retrieve", payload)
        return parse_retrieve_response(data, len(queries))

    async def asearch(self, queries: list[str], k: int) -> list[list[Passage]]:
        """Top ``k`` passages per query (large batches are split and sent concurrently)."""
        if isinstance(queries, str):
            raise TypeError("asearch takes a list of queries, not a single string")
        if not queries:
            return []
        step = self.max_queries_per_request
        parts = await asyncio.gather(*(self._search_chunk(queries[i : i + step], k) for i in range(0, len(queries), step)))
        return [r for part in parts for r in part]

    async def ahealth(self) -> dict:
        return await self._request("GET", "/health")

    async def astats(self) -> dict:
        return await self._request("GET", "/stats")

    async def aclose(self) -> None:
        client = self._clients.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.aclose()

    # -- sync API (runs the async one on a private event-loop thread) --------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._sync_loop is None:
                self._sync_loop = asyncio.new_event_loop()
                self._sync_thread = threading.Thread(target=self._sync_loop.run_forever, daemon=True, name="retrieval-client")
                self._sync_thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._sync_loop).result()

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        return self._run(self.asearch(queries, k))

    def health(self) -> dict:
        return self._run(self.ahealth())

    def stats(self) -> dict:
        return self._run(self.astats())

    def close(self) -> None:
        if self._sync_loop is not None:
            self._run(self.aclose())
            self._sync_loop.call_soon_threadsafe(self._sync_loop.stop)
            if self._sync_thread is not None:
                self._sync_thread.join(5)
            self._sync_loop.close()
            self._sync_loop = None

    def __enter__(self) -> "RetrievalClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "RetrievalClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _error_message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
        if isinstance(data, dict) and "error" in data:
            return str(data["error"])
    except ValueError:
        pass
    return resp.text[:200]


def parse_retrieve_response(data: Any, n_queries: int) -> list[list[Passage]]:
    """Passages from a ``/retrieve`` answer (with or without scores); shape errors raise."""
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise RetrievalError("malformed /retrieve response: expected {'result': [...]}")
    result = data["result"]
    if len(result) != n_queries:
        raise RetrievalError(f"malformed /retrieve response: {len(result)} result lists for {n_queries} queries")
    out: list[list[Passage]] = []
    try:
        for docs in result:
            row = []
            for item in docs:
                doc = item.get("document", item)
                row.append(Passage(id=str(doc["id"]), contents=doc["contents"], score=item.get("score")))
            out.append(row)
    except (AttributeError, KeyError, TypeError) as err:
        raise RetrievalError(f"malformed /retrieve response: {type(err).__name__}: {err}") from None
    return out

"""The retrieval client: the only way the rest of r3rag reaches a retriever.

``RetrievalClient(urls).search(queries, k) -> list[list[Passage]]`` (and ``await asearch``)
speaks the ``/retrieve`` dialect with scores. Requests go round-robin over the server URLs
(one replica per node on a cluster). A connection error, timeout, 5xx or 429 is retried on
the *next* URL after an exponential back-off with jitter
(``backoff * 2**attempt * uniform(0.5, 1.5)``, capped at ``max_backoff``); a 429 or 503 that
carries ``Retry-After`` (the service's answer when its queue is full) waits at least that long
(times ``uniform(1, 1.25)`` so a crowd of shed clients does not come back in step), again capped
at ``max_backoff``. A 4xx is the caller's mistake and raises at once. When the retries run out, :class:`RetrievalError` is
raised, so a caller can record a failed retrieval instead of silently using zero documents.
A response whose shape or length does not match the request is an error too, never an empty
result.

One HTTP connection pool per event loop, closed with it. An ``httpx.AsyncClient`` is bound to
the loop it first ran on, so each running loop gets its own, kept in a dict keyed weakly by the
loop object (never by ``id(loop)``: ids are reused once a loop is freed, which would hand a
client bound to a dead loop to a new one). With the pool the client also starts a tiny async
generator on that loop; ``asyncio.run`` (and any runner that calls
``loop.shutdown_asyncgens()``) closes every live async generator before closing the loop, and
closing this one closes the pool and forgets it. So 40 successive ``asyncio.run`` calls leave no
pool behind. A loop closed without that shutdown is detected (``loop.is_closed()``) and its pool
dropped the next time the client is used.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
import weakref
from collections import Counter
from email.utils import parsedate_to_datetime
from typing import Any, AsyncIterator, Coroutine, TypeVar

import httpx

from r3rag.data.records import Passage
from r3rag.errors import R3RagError

T = TypeVar("T")
RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
RETRY_AFTER_STATUS = frozenset({429, 503})


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait (delta-seconds or an HTTP date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)


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
        # loop -> (its pool, the async generator that closes the pool when the loop shuts down)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[httpx.AsyncClient, Any]] = (
            weakref.WeakKeyDictionary())
        self._clients_lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._sync_loop: asyncio.AbstractEventLoop | None = None
        self._sync_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- async API ---------------------------------------------------------------------
    async def _client(self) -> httpx.AsyncClient:
        """The connection pool of the running loop (made, and tied to the loop's shutdown, once)."""
        loop = asyncio.get_running_loop()
        with self._clients_lock:
            entry = self._clients.get(loop)
            if entry is not None:
                return entry[0]
            for dead in [lp for lp in self._clients if lp.is_closed()]:  # closed without asyncgen shutdown
                del self._clients[dead]
            client = httpx.AsyncClient(
                timeout=self.timeout, limits=httpx.Limits(max_connections=256, max_keepalive_connections=64)
            )
            guard = self._close_with_loop(loop, client)
            self._clients[loop] = (client, guard)
        await guard.__anext__()  # first iteration registers it with this loop's shutdown_asyncgens
        return client

    async def _close_with_loop(self, loop: asyncio.AbstractEventLoop, client: httpx.AsyncClient) -> AsyncIterator[None]:
        try:
            yield
        finally:
            with self._clients_lock:
                entry = self._clients.get(loop)
                if entry is not None and entry[0] is client:
                    del self._clients[loop]
            await client.aclose()

    def open_pools(self) -> int:
        """Connection pools currently held (one per live event loop that used this client)."""
        with self._clients_lock:
            return sum(1 for lp in self._clients if not lp.is_closed())

    def counters(self) -> dict[str, int]:
        """HTTP attempts, retries and responses by status (``status_503`` ...), since creation."""
        with self._clients_lock:
            return dict(self._counts)

    def _count(self, key: str) -> None:
        with self._clients_lock:
            self._counts[key] += 1

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Back-off before retry number ``attempt`` (0-based), with +-50 % jitter; at least
        ``retry_after`` (x U(1, 1.25)) when the server sent one, all capped at ``max_backoff``."""
        wait = min(self.max_backoff, self.backoff * (2**attempt)) * self._rng.uniform(0.5, 1.5)
        if retry_after is not None:
            wait = max(wait, retry_after * self._rng.uniform(1.0, 1.25))
        return min(self.max_backoff, wait)

    async def _request(self, method: str, path: str, payload: Any = None) -> Any:
        start = next(self._rr)
        last = "no attempt made"
        for attempt in range(self.retries + 1):
            url = self.urls[(start + attempt) % len(self.urls)] + path
            retry_after = None
            if attempt:
                self._count("retries")
            self._count("attempts")
            try:
                resp = await (await self._client()).request(method, url, json=payload)
            except httpx.TransportError as err:
                self._count("transport_errors")
                last = f"{url}: {type(err).__name__}: {err}"
            else:
                self._count(f"status_{resp.status_code}")
                if resp.status_code < 400:
                    try:
                        return resp.json()
                    except ValueError:
                        raise RetrievalError(f"{url}: response is not JSON", resp.status_code, attempt + 1) from None
                message = _error_message(resp)
                if resp.status_code not in RETRY_STATUS:
                    raise RetrievalError(f"{url}: HTTP {resp.status_code}: {message}", resp.status_code, attempt + 1)
                last = f"{url}: HTTP {resp.status_code}: {message}"
                if resp.status_code in RETRY_AFTER_STATUS:
                    retry_after = retry_after_seconds(resp.headers.get("retry-after"))
            if attempt < self.retries:
                await asyncio.sleep(self.delay(attempt, retry_after))
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
        """Close the running loop's pool (a later call on this loop opens a new one)."""
        with self._clients_lock:
            entry = self._clients.get(asyncio.get_running_loop())
        if entry is not None:
            await entry[1].aclose()  # runs the guard's finally: forget the pool, close it

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

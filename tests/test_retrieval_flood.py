"""A flood on loopback: 64 concurrent retrying clients against a service whose queue bound is 32.

What must hold under overload: only 200s and 503s (no other 5xx, no transport errors), ``/health``
answers within 1 s throughout, and every request a retrying client made eventually succeeds.

It is deterministic where it counts: the stand-in searcher's first call blocks until the service
has refused the first wave's 32 surplus requests, so the first wave alone always gives exactly
32 admitted and 32 shed; afterwards each batch costs a fixed 10 ms (``time.sleep``, a test
stand-in for a slow encoder), and clients honour ``Retry-After: 1``. The run stops by itself
(bounded requests, a gate with a time-out, a pytest time-out). ``pytest -s`` prints the counts.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
from collections import Counter

import httpx
import pytest

from r3rag.data.records import Passage
from r3rag.retrieval.client import RetrievalClient
from r3rag.retrieval.searcher import Searcher
from r3rag.retrieval.service import serve_in_thread

N_CLIENTS = 64
MAX_QUEUE = 32  # the clients are twice the bound
REQUESTS_PER_CLIENT = 4
BATCH_DELAY_S = 0.040


class SlowEcho(Searcher):
    """Echoes each query; the first call waits for ``gate``, every call costs ``delay`` seconds."""

    name, kind = "slow", "test"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.gate = threading.Event()
        self.queries = 0

    @property
    def size(self) -> int:
        return 1

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        assert self.gate.wait(60), "the flood's first wave never filled the queue"
        time.sleep(self.delay)
        self.queries += len(queries)
        return [[Passage(f"echo:{q}", q, 1.0)] for q in queries]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_flood_of_64_retrying_clients_at_twice_the_queue_bound():
    # Server, clients and poller share this process with whatever earlier tests left behind; a
    # served process does not carry a test session's objects, so keep them out of the collector's
    # full passes during the flood.
    gc.collect()
    gc.freeze()
    try:
        check_flood()
    finally:
        gc.unfreeze()


def check_flood() -> None:
    searcher = SlowEcho(BATCH_DELAY_S)
    with serve_in_thread([], searchers={"slow": searcher}, max_queue=MAX_QUEUE, retry_after_s=1, cache_size=0,
                         max_batch_queries=4, batch_window_ms=1.0) as server:
        batcher = server.runtime.batchers["slow"]
        done = threading.Event()
        first_wave: dict[str, int] = {}

        def open_gate() -> None:  # once the first wave has been split into 32 admitted + 32 shed
            deadline = time.monotonic() + 60
            while batcher.shed < N_CLIENTS - MAX_QUEUE and time.monotonic() < deadline and not done.is_set():
                time.sleep(0.005)
            first_wave.update(admitted=batcher.pending, shed=batcher.shed)  # nothing can finish before the gate opens
            searcher.gate.set()

        health: list[tuple[float, int | str]] = []

        def poll_health() -> None:
            with httpx.Client(timeout=1.0) as http:
                while not done.is_set():
                    t0 = time.perf_counter()
                    try:
                        status: int | str = http.get(server.url + "/health").status_code
                    except httpx.HTTPError as err:
                        status = type(err).__name__
                    health.append((time.perf_counter() - t0, status))
                    time.sleep(0.02)

        clients = [RetrievalClient(server.url, retries=40, backoff=0.05, max_backoff=2.0, timeout=60.0, seed=i)
                   for i in range(N_CLIENTS)]

        async def flood() -> list[list[str]]:
            async def user(i: int) -> list[str]:
                got = []
                for r in range(REQUESTS_PER_CLIENT):
                    [[doc]] = await clients[i].asearch([f"user {i} request {r}"], 1)
                    got.append(doc.id)
                return got

            return await asyncio.gather(*(user(i) for i in range(N_CLIENTS)))

        threads = [threading.Thread(target=open_gate), threading.Thread(target=poll_health)]
        for t in threads:
            t.start()
        t0 = time.perf_counter()
        try:
            results = asyncio.run(flood())
        finally:
            done.set()
            searcher.gate.set()
            for t in threads:
                t.join(30)
        seconds = time.perf_counter() - t0
        stats = httpx.get(server.url + "/stats", timeout=5).json()

    # every request eventually succeeded, with its own answer
    assert results == [[f"echo:user {i} request {r}" for r in range(REQUESTS_PER_CLIENT)] for i in range(N_CLIENTS)]
    # the first wave split exactly at the bound
    assert first_wave["admitted"] == MAX_QUEUE and first_wave["shed"] >= N_CLIENTS - MAX_QUEUE
    counts: Counter[str] = Counter()
    for c in clients:
        counts.update(c.counters())
    statuses = {k for k in counts if k.startswith("status_")}
    assert statuses == {"status_200", "status_503"}, counts  # nothing else, no other 5xx
    assert counts["transport_errors"] == 0
    assert counts["status_200"] == N_CLIENTS * REQUESTS_PER_CLIENT
    assert counts["status_503"] >= N_CLIENTS - MAX_QUEUE
    assert counts["retries"] == counts["status_503"]  # each 503 was retried, and nothing else was
    # the server saw the same
    assert stats["errors_by_status"] == {"503": counts["status_503"]}
    assert stats["queue"]["slow"]["shed"] == counts["status_503"]
    assert stats["requests"] == N_CLIENTS * REQUESTS_PER_CLIENT
    assert searcher.queries == N_CLIENTS * REQUESTS_PER_CLIENT  # a shed request is never searched
    # /health answered, in time, throughout
    assert len(health) >= 5
    assert all(status == 200 for _, status in health), Counter(s for _, s in health)
    max_health = max(lat for lat, _ in health)
    assert max_health < 1.0
    print("FLOOD " + json.dumps({
        "clients": N_CLIENTS, "max_queue": MAX_QUEUE, "requests": N_CLIENTS * REQUESTS_PER_CLIENT,
        "http_200": counts["status_200"], "http_503": counts["status_503"], "retries": counts["retries"],
        "other_status": sum(v for k, v in counts.items() if k.startswith("status_") and k not in ("status_200", "status_503")),
        "health_polls": len(health), "health_max_ms": round(max_health * 1000, 1),
        "health_p50_ms": round(sorted(lat for lat, _ in health)[len(health) // 2] * 1000, 1),
        "seconds": round(seconds, 2),
    }))

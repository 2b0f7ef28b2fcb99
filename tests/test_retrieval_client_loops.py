"""RetrievalClient and event loops: one connection pool per live loop, closed with it, never a
pool bound to a closed loop; and Retry-After honoured on 503/429."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
from email.utils import formatdate

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.client import RetrievalClient, retry_after_seconds
from r3rag.retrieval.service import serve_app_in_thread, serve_in_thread
from r3rag.retrieval.testing import write_toy_corpus


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("loops")
    build_bm25(write_toy_corpus(root / "corpus.jsonl"), root / "bm25", show_progress=False)
    with serve_in_thread(root / "bm25", bm25_backend="numpy") as h:
        yield h


def open_async_clients() -> int:
    """httpx.AsyncClient objects alive in this process and not closed (whoever made them)."""
    gc.collect()
    with warnings.catch_warnings():  # isinstance() on some torch objects warns about deprecations
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, httpx.AsyncClient) and not o.is_closed)


def test_forty_asyncio_runs_leave_at_most_one_live_pool(server):
    client = RetrievalClient(server.url)
    baseline = open_async_clients()
    pools_seen = []

    async def one(i: int):
        docs = await client.asearch([f"goats {i}"], 1)
        pools_seen.append(await client._client())
        assert client.open_pools() == 1  # this loop's pool, and no other
        return docs

    for i in range(40):
        [[top]] = asyncio.run(one(i))
        assert top.id == "doc-3"
        assert client.open_pools() == 0, f"run {i}: the pool outlived its loop"
        if i % 13 == 0:  # a process-wide count (slow with torch loaded: a few checkpoints)
            assert open_async_clients() - baseline <= 1
    assert open_async_clients() == baseline  # every pool was closed with its loop
    assert all(p.is_closed for p in pools_seen) and len({id(p) for p in pools_seen}) == 40
    # the sync API (its own loop thread) is unaffected and closes its pool on close()
    assert client.search(["goats"], 1)[0][0].id == "doc-3"
    assert client.open_pools() == 1
    client.close()
    assert client.open_pools() == 0 and open_async_clients() == baseline


def test_a_pool_of_a_closed_loop_is_never_handed_out(server):
    """A loop closed without ``shutdown_asyncgens`` (a bare ``run_until_complete``) leaves its pool
    behind; the next loop, even one that reuses the dead loop's ``id``, gets a fresh pool."""
    client = RetrievalClient(server.url, retries=0)
    old = asyncio.new_event_loop()
    stale = old.run_until_complete(client._client())
    assert old.run_until_complete(client.asearch(["goats"], 1))[0][0].id == "doc-3"
    old.close()  # no shutdown_asyncgens: the guard never ran
    del old
    gc.collect()
    for _ in range(30):  # CPython usually gives a new loop the freed loop's address: try to hit it
        loop = asyncio.new_event_loop()
        try:
            pool = loop.run_until_complete(client._client())
            assert pool is not stale and not pool.is_closed
            assert loop.run_until_complete(client.asearch(["comet"], 1))[0][0].id in {"doc-10", "doc-11"}
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
        assert pool.is_closed
        assert client.open_pools() == 0

    # A closed loop that is still referenced is detected too, and its pool dropped.
    kept = asyncio.new_event_loop()
    kept_pool = kept.run_until_complete(client._client())
    kept.close()

    async def fresh():
        return await client._client()

    assert asyncio.run(fresh()) is not kept_pool
    assert kept not in client._clients


def test_aclose_closes_this_loops_pool_and_a_later_call_opens_a_new_one(server):
    client = RetrievalClient(server.url)

    async def go():
        first = await client._client()
        await client.aclose()
        assert first.is_closed and client.open_pools() == 0
        docs = await client.asearch(["goats"], 1)
        second = await client._client()
        assert second is not first and not second.is_closed
        return docs

    assert asyncio.run(go())[0][0].id == "doc-3"
    assert client.open_pools() == 0


def test_pools_of_concurrent_loops_in_threads_are_separate(server):
    client = RetrievalClient(server.url)
    pools: list[httpx.AsyncClient] = []
    barrier = threading.Barrier(4)

    async def work(i: int):
        pool = await client._client()
        barrier.wait(10)  # all four loops hold their pool at once
        pools.append(pool)
        return await client.asearch([f"goats {i}"], 1)

    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            assert asyncio.run(work(i))[0][0].id == "doc-3"
        except BaseException as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len({id(p) for p in pools}) == 4 and all(p.is_closed for p in pools)
    assert client.open_pools() == 0


# ------------------------------------------------------------------ Retry-After
def test_retry_after_header_parsing():
    assert retry_after_seconds("2") == 2.0
    assert retry_after_seconds(" 1.5 ") == 1.5
    assert retry_after_seconds("-3") == 0.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("soon") is None
    assert retry_after_seconds("nan") is None
    now = time.time()
    assert retry_after_seconds(formatdate(now + 30, usegmt=True), now=now) == pytest.approx(30, abs=1.5)
    assert retry_after_seconds(formatdate(now - 30, usegmt=True), now=now) == 0.0


def test_delay_honours_retry_after_up_to_max_backoff():
    c = RetrievalClient("http://127.0.0.1:1", backoff=0.01, max_backoff=5.0, seed=3)
    for attempt in range(4):
        d = c.delay(attempt, retry_after=1.0)
        assert 1.0 <= d <= 1.25
    assert c.delay(0, retry_after=60.0) == 5.0  # capped: a server cannot park a client for a minute
    assert c.delay(0) < 0.02  # without the header: the plain back-off


def test_client_waits_the_retry_after_of_a_503_then_succeeds():
    arrivals: list[float] = []
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/retrieve")
    async def retrieve():
        arrivals.append(time.monotonic())
        if len(arrivals) == 1:
            return JSONResponse({"error": "queue full", "status": 503}, status_code=503, headers={"Retry-After": "1"})
        return {"result": [[{"document": {"id": "d", "contents": "t\nx"}, "score": 1.0}]]}

    with serve_app_in_thread(app) as h:
        with RetrievalClient(h.url, retries=3, backoff=0.01, max_backoff=5.0, seed=0) as client:
            [[doc]] = client.search(["q"], 1)
            counts = client.counters()
    assert doc.id == "d"
    assert len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 1.0  # the plain back-off alone would have been ~0.01 s
    assert counts["status_503"] == 1 and counts["status_200"] == 1 and counts["retries"] == 1

"""The retrieval client: results, round-robin, fail-over, retries, typed errors, kill/restart."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from r3rag.data.records import Passage
from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.client import RetrievalClient, RetrievalError, parse_retrieve_response
from r3rag.retrieval.searcher import Searcher, load_searcher
from r3rag.retrieval.service import serve_in_thread
from r3rag.retrieval.testing import write_toy_corpus

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def bm25_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    build_bm25(write_toy_corpus(root / "corpus.jsonl"), root / "bm25", show_progress=False)
    return root / "bm25"


@pytest.fixture(scope="module")
def server(bm25_dir):
    with serve_in_thread(bm25_dir, bm25_backend="numpy") as h:
        yield h


def test_sync_and_async_search_match_in_process(server, bm25_dir):
    local = load_searcher(bm25_dir, backend="numpy")
    queries = ["goats", "capital of the Veltan Empire", "comet"]
    with RetrievalClient(server.url) as client:
        got = client.search(queries, 3)
        assert client.health()["status"] == "ok"
    assert [[(p.id, p.contents) for p in ps] for ps in got] == [[(p.id, p.contents) for p in ps] for ps in local.search(queries, 3)]
    assert got[0][0].score == pytest.approx(local.search(["goats"], 1)[0][0].score)

    async def run():
        client = RetrievalClient([server.url], max_queries_per_request=2)  # 3 queries -> 2 requests
        try:
            return await client.asearch(queries, 3)
        finally:
            await client.aclose()

    assert [[p.id for p in ps] for ps in asyncio.run(run())] == [[p.id for p in ps] for ps in got]
    assert RetrievalClient(server.url).search([], 3) == []


def test_round_robin_over_replicas(bm25_dir):
    with serve_in_thread(bm25_dir, bm25_backend="numpy") as a, serve_in_thread(bm25_dir, bm25_backend="numpy") as b:
        with RetrievalClient([a.url, b.url]) as client:
            for i in range(6):
                client.search([f"goats {i}"], 1)
        assert a.runtime.stats.snapshot()["requests"] == 3
        assert b.runtime.stats.snapshot()["requests"] == 3


def test_fail_over_to_live_replica(server):
    dead = f"http://127.0.0.1:{free_port()}"
    with RetrievalClient([dead, server.url], retries=2, backoff=0.01) as client:
        for _ in range(4):
            [[top]] = client.search(["goats"], 1)
            assert top.id == "doc-3"


def test_retries_exhausted_raise_typed_error():
    dead = f"http://127.0.0.1:{free_port()}"
    client = RetrievalClient(dead, retries=2, backoff=0.05, seed=0)
    t0 = time.perf_counter()
    with pytest.raises(RetrievalError, match="after 3 attempts") as info:
        client.search(["goats"], 1)
    assert info.value.attempts == 3
    assert time.perf_counter() - t0 >= 0.5 * (0.05 + 0.1)  # two back-offs, jitter >= 0.5x
    client.close()


def test_4xx_raises_at_once_with_server_message(server):
    with RetrievalClient(server.url, retries=5, backoff=1.0) as client:
        with pytest.raises(RetrievalError, match="between 1 and") as info:
            client.search(["goats"], 0)
        assert info.value.status == 422 and info.value.attempts == 1  # no retry on a 4xx


class FlakySearcher(Searcher):
    name, kind = "flaky", "test"

    def __init__(self, failures: int) -> None:
        self.failures = failures

    @property
    def size(self) -> int:
        return 1

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("transient")
        return [[Passage("p", q, 1.0)] for q in queries]


def test_5xx_is_retried_until_success():
    with serve_in_thread([], searchers={"flaky": FlakySearcher(2)}, cache_size=0) as h:
        with RetrievalClient(h.url, retries=3, backoff=0.01) as client:
            assert client.search(["hello"], 1) == [[Passage("p", "hello", 1.0)]]


def test_backoff_grows_and_is_capped():
    c = RetrievalClient("http://127.0.0.1:1", backoff=0.2, max_backoff=1.0, seed=1)
    delays = [c.delay(a) for a in range(6)]
    for a, d in enumerate(delays):
        base = min(1.0, 0.2 * 2**a)
        assert 0.5 * base <= d <= 1.5 * base


def test_malformed_responses_are_errors_not_empty_results():
    with pytest.raises(RetrievalError, match="2 result lists for 3"):
        parse_retrieve_response({"result": [[], []]}, 3)
    with pytest.raises(RetrievalError, match="malformed"):
        parse_retrieve_response({"results": []}, 1)
    with pytest.raises(RetrievalError, match="malformed"):
        parse_retrieve_response({"result": [[{"document": {"id": 1}}]]}, 1)
    no_scores = parse_retrieve_response({"result": [[{"id": 7, "contents": "t\nx"}]]}, 1)
    assert no_scores == [[Passage("7", "t\nx", None)]]


def _start_server(index: Path, port: int) -> subprocess.Popen:
    cmd = [sys.executable, str(ROOT / "tool" / "retrieval_server.py"), "--index", str(index), "--port", str(port),
           "--set", "bm25_backend=numpy"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited: {proc.stderr.read().decode()[-500:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise AssertionError("server did not become healthy")


@pytest.mark.slow
def test_server_killed_and_restarted_mid_batch(bm25_dir):
    """Batches keep flowing while the server is SIGKILLed and restarted: every batch comes back
    complete (retries carry it), or the client raises RetrievalError; never an empty result."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_server(bm25_dir, port)
    procs = [proc]
    try:
        _wait_healthy(url, proc)
        client = RetrievalClient(url, retries=60, backoff=0.1, max_backoff=0.5, timeout=5.0)
        outcomes: list[str] = []
        stop = threading.Event()

        def work() -> None:
            i = 0
            while not stop.is_set():
                queries = [f"goats {i} {j}" for j in range(32)]
                try:
                    res = client.search(queries, 3)
                    assert len(res) == 32 and all(len(r) == 3 for r in res)
                    outcomes.append("ok")
                except RetrievalError:
                    outcomes.append("error")
                i += 1

        worker = threading.Thread(target=work)
        worker.start()
        while outcomes.count("ok") < 3:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at = len(outcomes)
        time.sleep(0.5)
        proc = _start_server(bm25_dir, port)
        procs.append(proc)
        _wait_healthy(url, proc)
        time.sleep(0.5)
        stop.set()
        worker.join(60)
        assert outcomes.count("ok") > killed_at, "batches resumed after the restart"
        assert outcomes.count("error") == 0, "retries should have carried every batch over the restart"
        client.close()

        # Killed for good: the typed error, not an empty result.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        with RetrievalClient(url, retries=2, backoff=0.01) as dead:
            with pytest.raises(RetrievalError, match="ConnectError|attempts"):
                dead.search(["goats"], 3)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()

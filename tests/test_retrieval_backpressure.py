"""Back-pressure: a bounded batcher queue, 503 + Retry-After past it, uvicorn's concurrency cap
from the config, and large bodies decoded / encoded off the event loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from r3rag.data.records import Passage
from r3rag.retrieval import service
from r3rag.retrieval.batcher import MicroBatcher, Overloaded
from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.dialects import DIALECTS, Limits
from r3rag.retrieval.searcher import Searcher
from r3rag.retrieval.service import encode_payload, serve_in_thread
from r3rag.retrieval.testing import write_toy_corpus

ROOT = Path(__file__).resolve().parents[1]


class GateSearcher(Searcher):
    """Echo searcher whose calls block until ``gate`` opens; counts calls in flight."""

    name, kind = "gate", "test"

    def __init__(self, passages: int = 1, contents: str = "") -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.passages, self.contents = passages, contents
        self.calls: list[list[str]] = []

    @property
    def size(self) -> int:
        return 1

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append(list(queries))
        self.entered.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return [[Passage(f"{q}#{i}", f"{q} {self.contents}", 1.0) for i in range(min(k, self.passages))] for q in queries]


def wait_for(cond, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.mark.parametrize("enabled", [True, False], ids=["microbatch", "no-microbatch"])
def test_batcher_admits_exactly_max_queue_and_refuses_the_rest_at_once(enabled):
    searcher = GateSearcher()

    async def go():
        b = MicroBatcher(searcher, window_s=0.001, max_batch=64, enabled=enabled, max_queue=3)
        try:
            tasks = [asyncio.create_task(b.search([f"q{i}"], 1)) for i in range(5)]
            await asyncio.sleep(0)  # every task has run up to its first await
            refused = [t for t in tasks if t.done()]
            assert len(refused) == 2 and all(isinstance(t.exception(), Overloaded) for t in refused)
            assert "max_queue=3" in str(refused[0].exception())
            assert b.pending == 3 and b.shed == 2
            searcher.gate.set()
            done = await asyncio.gather(*tasks[:3])
            assert b.pending == 0
            # room again: a new request is admitted
            assert (await b.search(["again"], 1))[0][0].id == "again#0"
            return done
        finally:
            await b.aclose()

    done = asyncio.run(go())
    assert [[p.id for p in r[0]] for r in done] == [["q0#0"], ["q1#0"], ["q2#0"]]
    assert sorted(q for call in searcher.calls for q in call) == ["again", "q0", "q1", "q2"]  # refused: never searched


def test_unbounded_when_max_queue_is_zero():
    searcher = GateSearcher()

    async def go():
        b = MicroBatcher(searcher, window_s=0.001, max_queue=0)
        try:
            tasks = [asyncio.create_task(b.search([f"q{i}"], 1)) for i in range(50)]
            await asyncio.sleep(0)
            assert not any(t.done() for t in tasks) and b.pending == 50
            searcher.gate.set()
            return await asyncio.gather(*tasks)
        finally:
            await b.aclose()

    assert len(asyncio.run(go())) == 50


def test_a_cancelled_request_is_dropped_from_the_queue_unsearched():
    searcher = GateSearcher()

    async def go():
        b = MicroBatcher(searcher, window_s=0.0, max_batch=1, max_queue=10)
        try:
            first = asyncio.create_task(b.search(["first"], 1))
            await asyncio.sleep(0.05)  # 'first' is now being searched (blocked on the gate)
            gone = asyncio.create_task(b.search(["gone"], 1))
            kept = asyncio.create_task(b.search(["kept"], 1))
            await asyncio.sleep(0)
            gone.cancel()
            await asyncio.sleep(0)
            searcher.gate.set()
            await first
            return await kept
        finally:
            await b.aclose()

    assert asyncio.run(go())[0][0].id == "kept#0"
    assert searcher.calls == [["first"], ["kept"]]


def test_service_answers_503_with_retry_after_and_stays_healthy():
    searcher = GateSearcher()
    with serve_in_thread([], searchers={"gate": searcher}, max_queue=2, retry_after_s=3, cache_size=100,
                         batch_window_ms=0.0, max_batch_queries=1) as h:
        searcher.gate.set()  # warm the cache with one query
        assert httpx.post(h.url + "/retrieve", json={"queries": ["cached"], "topk": 1}).status_code == 200
        searcher.gate.clear()
        results: list[int] = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            httpx.post(h.url + "/retrieve", json={"queries": [f"held {i}"], "topk": 1}, timeout=60).status_code))
            for i in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: h.runtime.batchers["gate"].pending == 2)

        r = httpx.post(h.url + "/retrieve", json={"queries": ["one too many"], "topk": 1}, timeout=10)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "3"
        body = r.json()
        assert body["status"] == 503 and body["retry_after_s"] == 3
        assert "'gate'" in body["error"] and "max_queue=2" in body["error"]
        for path, payload in (("/search", {"query": "also too many"}), ("/queries", {"queries": ["and this"], "k": 1})):
            assert httpx.post(h.url + path, json=payload, timeout=10).status_code == 503
        # a cached query needs no search: answered even now
        assert httpx.post(h.url + "/retrieve", json={"queries": ["cached"], "topk": 1}, timeout=10).status_code == 200
        assert httpx.get(h.url + "/health", timeout=1.0).status_code == 200
        stats = httpx.get(h.url + "/stats", timeout=5).json()
        assert stats["queue"]["gate"] == {"pending": 2, "max_queue": 2, "shed": 3}
        assert stats["errors_by_status"] == {"503": 3}

        searcher.gate.set()
        for t in threads:
            t.join(30)
        assert results == [200, 200]
        assert httpx.post(h.url + "/retrieve", json={"queries": ["room again"], "topk": 1}).status_code == 200
        assert searcher.calls.count(["one too many"]) == 0


def test_uvicorn_concurrency_limit_comes_from_the_config():
    import socket

    searcher = GateSearcher()
    searcher.gate.set()
    with serve_in_thread([], searchers={"gate": searcher}) as h:
        assert h.server.config.limit_concurrency == 1024  # the default
    with serve_in_thread([], searchers={"gate": searcher}, limit_concurrency=0) as h:
        assert h.server.config.limit_concurrency is None  # 0: no cap
    with serve_in_thread([], searchers={"gate": searcher}, limit_concurrency=3) as h:
        assert h.server.config.limit_concurrency == 3
        # past the cap uvicorn itself sheds, on every path: hold 3 idle connections open
        wait_for(lambda: len(h.server.server_state.connections) == 0)
        held = [socket.create_connection((h.host, h.port)) for _ in range(3)]
        try:
            wait_for(lambda: len(h.server.server_state.connections) >= 3)
            assert httpx.get(h.url + "/health", timeout=5).status_code == 503
        finally:
            for s in held:
                s.close()
        wait_for(lambda: httpx.get(h.url + "/health", timeout=5).status_code == 200)


def test_server_flags_reach_the_config_and_uvicorn(tmp_path, monkeypatch):
    import importlib.util

    import uvicorn

    build_bm25(write_toy_corpus(tmp_path / "corpus.jsonl"), tmp_path / "bm25", show_progress=False)
    spec = importlib.util.spec_from_file_location("retrieval_server_tool", ROOT / "tool" / "retrieval_server.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    seen: dict = {}

    def fake_run(app, **kwargs):
        seen.update(kwargs, app=app)

    monkeypatch.setattr(uvicorn, "run", fake_run)
    assert tool.main(["--index", str(tmp_path / "bm25"), "--max-queue", "9", "--retry-after", "4",
                      "--limit-concurrency", "77", "--set", "bm25_backend=numpy"]) == 0
    rt = seen["app"].state.runtime
    assert seen["limit_concurrency"] == 77 and seen["host"] == "127.0.0.1"
    assert rt.cfg.max_queue == 9 and rt.cfg.retry_after_s == 4
    assert all(b.max_queue == 9 for b in rt.batchers.values())
    seen.clear()
    assert tool.main(["--index", str(tmp_path / "bm25"), "--set", "bm25_backend=numpy"]) == 0
    assert seen["limit_concurrency"] == 1024 and seen["app"].state.runtime.cfg.max_queue == 256


# ------------------------------------------------------------------ off-loop codec
def test_encode_payload_is_byte_identical_to_one_dumps():
    limits = Limits(512, 4096, 200, 5)
    rows = [[Passage(f"id{i}-{j}", f"Tïtle {i}\ntext ✓ \"quoted\" {j}", 0.5 + j) for j in range(3)] for i in range(4)]
    for d in DIALECTS.values():
        for body in ({"queries": ["a", "b", "c", "d"], "topk": 3}, {"query": "a", "topk": 3},
                     {"queries": ["a", "b", "c", "d"], "k": 3}, {"queries": ["a", "b", "c", "d"], "topk": 3, "return_scores": False}):
            try:
                req = d.parse(body, limits)
            except Exception:  # noqa: BLE001 - not this dialect's shape
                continue
            payload = d.render(req, rows[: len(req.queries)])
            assert encode_payload(payload) == orjson.dumps(payload)
            assert json.loads(encode_payload(payload)) == payload
    assert encode_payload([]) == b"[]" and encode_payload({"result": []}) == b'{"result":[]}'


def test_large_bodies_are_decoded_and_encoded_off_the_event_loop(monkeypatch):
    """A slow decode or encode of a large body runs on a codec thread, so /health answers within
    1 s meanwhile; small bodies stay on the loop (no thread hop for the common case)."""
    searcher = GateSearcher(passages=5, contents="x" * 300)
    searcher.gate.set()
    where: dict[str, list[str]] = {"decode": [], "encode": []}
    busy = {"decode": threading.Event(), "encode": threading.Event()}
    slow = {"on": True}
    real_decode, real_encode = service.decode_body, service.render_and_encode

    def slow_decode(raw):
        where["decode"].append(threading.current_thread().name)
        if slow["on"] and len(raw) > 4096:
            busy["decode"].set()
            time.sleep(1.5)
        return real_decode(raw)

    def slow_encode(d, req, results):
        where["encode"].append(threading.current_thread().name)
        if slow["on"]:
            busy["encode"].set()
            time.sleep(1.5)
        return real_encode(d, req, results)

    monkeypatch.setattr(service, "decode_body", slow_decode)
    monkeypatch.setattr(service, "render_and_encode", slow_encode)
    with serve_in_thread([], searchers={"gate": searcher}, offload_bytes=4096, cache_size=0) as h:
        big_request = {"queries": [f"query {i} " + "y" * 40 for i in range(100)], "topk": 1}  # ~6 KB body
        for stage, body in (("decode", big_request), ("encode", {"queries": ["q1", "q2", "q3", "q4"], "topk": 5})):
            busy[stage].clear()
            out: list[httpx.Response] = []
            t = threading.Thread(target=lambda b=body: out.append(httpx.post(h.url + "/retrieve", json=b, timeout=30)))
            t.start()
            assert busy[stage].wait(20), f"the {stage} stage never ran"
            t0 = time.perf_counter()
            assert httpx.get(h.url + "/health", timeout=1.0).status_code == 200
            assert time.perf_counter() - t0 < 1.0
            t.join(30)
            assert out[0].status_code == 200
            assert len(out[0].json()["result"]) == len(body["queries"])
            assert where[stage][-1].startswith("codec"), f"{stage} ran on {where[stage][-1]}"
        slow["on"] = False
        n_encode = len(where["encode"])
        r = httpx.post(h.url + "/retrieve", json={"queries": ["tiny"], "topk": 1}, timeout=10)
        assert r.status_code == 200 and r.json()["result"][0][0]["document"]["id"] == "tiny#0"
        assert not where["decode"][-1].startswith("codec")  # small body: decoded on the loop
        assert len(where["encode"]) == n_encode  # small answer: rendered on the loop, not offloaded
        assert h.runtime.stats_snapshot()["offloaded"] >= 3

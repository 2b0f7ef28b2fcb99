"""The HTTP service: dialects, index selection, cache, stats, micro-batching, bad input."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from r3rag.data.records import Passage
from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.config import ServiceConfig
from r3rag.retrieval.dense_index import build_dense
from r3rag.retrieval.encoders import Encoder
from r3rag.retrieval.searcher import Searcher, load_searcher
from r3rag.retrieval.service import serve_in_thread
from r3rag.retrieval.testing import TOY_PASSAGES, make_tiny_encoder, write_toy_corpus

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def indexes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("svc")
    corpus = write_toy_corpus(root / "corpus.jsonl")
    build_bm25(corpus, root / "bm25", show_progress=False)
    enc = Encoder(str(make_tiny_encoder(root / "tiny-bert")), family="sbert", device="cpu")
    build_dense(corpus, root / "dense", enc, show_progress=False)
    return {"bm25": root / "bm25", "dense": root / "dense"}


@pytest.fixture(scope="module")
def server(indexes):
    with serve_in_thread([indexes["bm25"], indexes["dense"]], hybrid=True, default_index="bm25",
                         bm25_backend="numpy", batch_window_ms=20.0) as handle:
        yield handle


@pytest.fixture(scope="module")
def local(indexes):
    return load_searcher(indexes["bm25"], backend="numpy")


def post(server, path: str, body=None, content: bytes | None = None, headers=None) -> httpx.Response:
    if content is not None:
        return httpx.post(server.url + path, content=content, headers=headers or {}, timeout=10)
    return httpx.post(server.url + path, json=body, timeout=10)


def test_health_and_binding(server):
    r = httpx.get(server.url + "/health", timeout=5)
    assert r.status_code == 200
    assert r.json() == {"status": "ok", "indexes": ["bm25", "dense", "hybrid"], "default_index": "bm25"}
    assert server.host == "127.0.0.1" and ServiceConfig().host == "127.0.0.1"


def test_retrieve_dialect_with_and_without_scores(server, local):
    queries = ["capital of the Veltan Empire", "goats"]
    expected = local.search(queries, 3)
    with_scores = post(server, "/retrieve", {"queries": queries, "topk": 3, "return_scores": True}).json()
    assert [[d["document"]["id"] for d in r] for r in with_scores["result"]] == [[p.id for p in ps] for ps in expected]
    assert with_scores["result"][0][0]["score"] == pytest.approx(expected[0][0].score)
    assert with_scores["result"][0][0]["document"]["contents"] == expected[0][0].contents
    without = post(server, "/retrieve", {"queries": queries, "topk": 3, "return_scores": False})
    assert without.status_code == 200
    assert without.json()["result"][1][0] == {"id": expected[1][0].id, "contents": expected[1][0].contents}


def test_r3rag_search_dialect(server, local):
    single = post(server, "/search", {"query": "goats"}).json()
    assert isinstance(single, list) and len(single) == 5 and single[0]["id"] == "doc-3"
    assert set(single[0]) == {"id", "contents"}
    many = post(server, "/search", {"querys": ["goats", "comet"], "topk": 2}).json()
    assert [[d["id"] for d in r] for r in many] == [[p.id for p in ps] for ps in local.search(["goats", "comet"], 2)]


def test_r1searcher_queries_dialect(server, local):
    body = post(server, "/queries", {"queries": ["silver mines", "goats"], "k": 2}).json()
    assert body["queries"] == ["silver mines", "goats"]
    assert body["answers"] == [[p.contents for p in ps] for ps in local.search(["silver mines", "goats"], 2)]


def test_index_selection_and_hybrid(server, indexes):
    dense = load_searcher(indexes["dense"])
    got = post(server, "/retrieve", {"queries": ["Quorrin goats"], "topk": 3, "index": "dense"}).json()
    assert [d["document"]["id"] for d in got["result"][0]] == [p.id for p in dense.search(["Quorrin goats"], 3)[0]]
    hybrid = post(server, "/retrieve", {"queries": ["Quorrin goats"], "topk": 3, "index": "hybrid"}).json()
    assert hybrid["result"][0][0]["score"] == pytest.approx(2 / 61, rel=0.5)  # RRF scores, not BM25's
    assert len(hybrid["result"][0]) == 3


def test_cache_hits_and_stats_counts(server):
    before = httpx.get(server.url + "/stats").json()
    body = {"queries": ["Marnet Lake winter", "Tessaly Bridge"], "topk": 4}
    first = post(server, "/retrieve", body).json()
    second = post(server, "/retrieve", body).json()
    assert first == second
    after = httpx.get(server.url + "/stats").json()
    assert after["requests"] - before["requests"] == 2
    assert after["queries"] - before["queries"] == 4
    assert after["cache_hits"] - before["cache_hits"] == 2
    assert after["cache_misses"] - before["cache_misses"] == 2
    assert after["latency_ms"]["p50"] is not None and after["latency_ms"]["p99"] >= after["latency_ms"]["p50"]


def test_concurrent_requests_are_batched_and_split_correctly(server, local):
    queries = [f"{t} {x.split()[-1]}" for t, x in TOY_PASSAGES]  # unique: no cache hits
    ks = [1 + i % 4 for i in range(len(queries))]
    before = server.runtime.batchers["bm25"].batches

    async def go():
        async with httpx.AsyncClient(timeout=10) as c:
            return await asyncio.gather(*(c.post(server.url + "/retrieve", json={"queries": [q], "topk": k})
                                          for q, k in zip(queries, ks)))

    responses = asyncio.run(go())
    batches = server.runtime.batchers["bm25"].batches - before
    assert batches < len(queries), "concurrent single-query requests should share batches"
    for q, k, r in zip(queries, ks, responses):
        assert [d["document"]["id"] for d in r.json()["result"][0]] == [p.id for p in local.search([q], k)[0]]


BAD_INPUTS = [
    ("/retrieve", b"", 400, "empty"),
    ("/retrieve", b"{not json", 400, "not valid JSON"),
    ("/retrieve", b'{"queries": ["caf\xe9"]}', 400, "UTF-8"),
    ("/retrieve", b"[" * 100000, 400, "JSON"),
    ("/retrieve", b'["goats"]', 422, "JSON object"),
    ("/retrieve", b'{"topk": 3}', 422, "missing field 'queries'"),
    ("/retrieve", b'{"queries": "goats"}', 422, "'queries' must be an array"),
    ("/retrieve", b'{"queries": []}', 422, "empty array"),
    ("/retrieve", b'{"queries": [1]}', 422, "queries[0] must be a string"),
    ("/retrieve", b'{"queries": ["ok", null]}', 422, "queries[1]"),
    ("/retrieve", b'{"queries": ["   "]}', 422, "is empty"),
    ("/retrieve", b'{"queries": ["' + b"a" * 5000 + b'"]}', 422, "limit is 4096"),
    ("/retrieve", b'{"queries": ["a"], "topk": 0}', 422, "between 1 and"),
    ("/retrieve", b'{"queries": ["a"], "topk": 100000}', 422, "between 1 and"),
    ("/retrieve", b'{"queries": ["a"], "topk": "5"}', 422, "'topk' must be an integer"),
    ("/retrieve", b'{"queries": ["a"], "topk": 2.5}', 422, "integer"),
    ("/retrieve", b'{"queries": ["a"], "topk": true}', 422, "integer"),
    ("/retrieve", b'{"queries": ["a"], "return_scores": "yes"}', 422, "true or false"),
    ("/retrieve", b'{"queries": ["a"], "top_k": 3}', 422, "unknown field"),
    ("/retrieve", b'{"queries": ["a"], "index": "nope"}', 404, "unknown index 'nope'"),
    ("/retrieve", b'{"queries": ["a"], "index": 3}', 422, "'index' must be a string"),
    ("/retrieve", b'{"queries": ["\\ud800"]}', 422, "surrogate"),
    ("/retrieve", b'{"queries": ["a\\u0000b"]}', 422, "NUL"),
    ("/search", b'{"query": "a", "querys": ["b"]}', 422, "exactly one"),
    ("/search", b'{"query": 7}', 422, "query must be a string"),
    ("/search", b"{}", 422, "exactly one"),
    ("/queries", b'{"queries": ["a"], "k": -1}', 422, "'k' must be between"),
    ("/nowhere", b"{}", 404, "endpoints"),
]


@pytest.mark.parametrize("path,content,status,fragment", BAD_INPUTS, ids=[f"{i}:{b[2]}" for i, b in enumerate(BAD_INPUTS)])
def test_bad_input_gets_a_clear_4xx(server, path, content, status, fragment):
    r = post(server, path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]


def test_limits_on_size_and_count_then_still_healthy(server):
    too_many = post(server, "/retrieve", {"queries": ["a"] * 513})
    assert too_many.status_code == 413 and "limit is 512" in too_many.json()["error"]
    huge = post(server, "/retrieve", content=b'{"queries": ["' + b"a" * (5 * 1024 * 1024) + b'"]}')
    assert huge.status_code == 413 and "limit" in huge.json()["error"]
    wrong_method = httpx.get(server.url + "/retrieve")
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()
    assert httpx.get(server.url + "/health").status_code == 200
    assert post(server, "/retrieve", {"queries": ["goats"], "topk": 1}).json()["result"][0][0]["document"]["id"] == "doc-3"
    assert httpx.get(server.url + "/stats").json()["errors"] >= 3


class SlowSearcher(Searcher):
    """Blocks in search until the test opens its gate (like a heavy encoder), and fails on demand."""

    name, kind = "slow", "test"

    def __init__(self) -> None:
        self.gate, self.entered, self.fail = threading.Event(), threading.Event(), False

    @property
    def size(self) -> int:
        return 1

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.entered.set()
        assert self.gate.wait(60), "test never opened the gate"
        if self.fail:
            raise RuntimeError("disk on fire")
        return [[Passage("p", f"echo {q}", 1.0)] for q in queries]


def test_health_stays_responsive_under_load_and_failures_are_500_json():
    slow = SlowSearcher()
    with serve_in_thread([], searchers={"slow": slow}, microbatch=False, cache_size=0) as h:
        results: list[int] = []

        def hammer(i: int) -> None:
            results.append(httpx.post(h.url + "/retrieve", json={"queries": [f"q{i}"]}, timeout=60).status_code)

        threads = [threading.Thread(target=hammer, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        assert slow.entered.wait(30), "no search reached the searcher"
        # every search is now stuck until the gate opens: /health must answer anyway
        assert httpx.get(h.url + "/health", timeout=30).status_code == 200
        assert results == [], "no search can have finished while the gate is shut"
        slow.gate.set()
        for t in threads:
            t.join()
        assert results == [200] * 6
        slow.fail = True
        r = httpx.post(h.url + "/retrieve", json={"queries": ["x"]}, timeout=5)
        assert r.status_code == 500 and "disk on fire" in r.json()["error"] and "Traceback" not in r.text
        assert httpx.get(h.url + "/health").status_code == 200


class _RecordingSearcher(Searcher):
    """Answers query q with one passage whose id is q, and records every batch it is given."""

    name, kind = "rec", "test"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    @property
    def size(self) -> int:
        return 1

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.batches.append(list(queries))
        return [[Passage(id=q, contents=q)] for q in queries]


def test_batch_cap_is_strict_and_an_oversized_request_runs_alone():
    from r3rag.retrieval.batcher import MicroBatcher

    rec = _RecordingSearcher()
    requests = [["a1", "a2", "a3"], ["b1", "b2", "b3"], ["c1", "c2"], [f"d{i}" for i in range(7)]]

    async def go():
        b = MicroBatcher(rec, window_s=0.5, max_batch=5)
        try:
            return await asyncio.gather(*(b.search(r, 1) for r in requests))
        finally:
            await b.aclose()

    results = asyncio.run(go())
    # a (3) + b (3) would exceed 5, so b starts the next batch and c (2) joins it; d (7) is alone.
    assert rec.batches == [requests[0], requests[1] + requests[2], requests[3]]
    for req, res in zip(requests, results):
        assert [[p.id for p in ps] for ps in res] == [[q] for q in req]

"""The hybrid searcher shares its members with their own batchers: calls on one member are
serialised (one lock per searcher), and concurrent hybrid and member searches give exactly the
results of sequential calls."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch

from r3rag.data.records import Passage
from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.dense_index import build_dense
from r3rag.retrieval.encoders import Encoder
from r3rag.retrieval.hybrid import HybridSearcher
from r3rag.retrieval.locks import locked_search, search_lock
from r3rag.retrieval.searcher import Searcher
from r3rag.retrieval.service import load_searchers, serve_in_thread
from r3rag.retrieval.testing import TOY_PASSAGES, make_tiny_encoder, write_toy_corpus

torch.set_num_threads(1)


class UnsafeSearcher(Searcher):
    """A searcher that is *not* thread-safe, like many real ones: it keeps the batch being
    searched on the object. Two overlapping calls answer each other's queries; it also counts how
    many calls were ever inside it at once."""

    kind = "unsafe"

    def __init__(self, name: str, salt: int) -> None:
        self.name, self.salt = name, salt
        self._current: list[str] = []
        self._inside = 0
        self.max_inside = 0
        self._count = threading.Lock()

    @property
    def size(self) -> int:
        return 100

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        with self._count:
            self._inside += 1
            self.max_inside = max(self.max_inside, self._inside)
        try:
            self._current = list(queries)
            time.sleep(0.002)  # the encoder / index call: other threads run meanwhile
            return [[Passage(f"{q}|{(self.salt * (i + 1) + len(q)) % 7}", q, 1.0 / (i + 1)) for i in range(k)]
                    for q in self._current]
        finally:
            with self._count:
                self._inside -= 1


def expected(searcher: Searcher, queries: list[str], k: int) -> list[list[tuple[str, float]]]:
    return [[(p.id, round(p.score, 9)) for p in ps] for ps in searcher.search(queries, k)]


def as_ids(results: list[list[Passage]]) -> list[list[tuple[str, float]]]:
    return [[(p.id, round(p.score, 9)) for p in ps] for ps in results]


def test_locks_are_per_searcher_and_reentrant():
    a, b = UnsafeSearcher("a", 1), UnsafeSearcher("b", 2)
    assert search_lock(a) is search_lock(a) and search_lock(a) is not search_lock(b)
    with search_lock(a):
        assert locked_search(a, ["x"], 1)[0][0].contents == "x"  # re-entrant on the same thread


def test_threads_calling_hybrid_and_members_at_once_match_sequential_calls():
    a, b = UnsafeSearcher("a", 3), UnsafeSearcher("b", 5)
    hybrid = HybridSearcher([a, b], depth=4)
    jobs = [(s, [f"{s.name} query {i} {j}" for j in range(1 + i % 3)], 1 + i % 4)
            for i in range(40) for s in (a, b, hybrid)]
    want = [expected(s, qs, k) for s, qs, k in jobs]  # sequential, one call at a time
    a.max_inside = b.max_inside = 0

    def call(job):
        s, qs, k = job
        return as_ids(locked_search(s, qs, k))  # how each batcher thread calls its searcher

    with ThreadPoolExecutor(max_workers=12) as pool:
        got = list(pool.map(call, jobs))
    assert got == want
    assert a.max_inside == 1 and b.max_inside == 1  # never two calls inside one member


def test_service_hybrid_and_member_requests_at_once_match_sequential():
    """Through the service: the hybrid's batcher thread and each member's batcher thread share
    the member objects; concurrent requests to all three indexes return the sequential results."""
    a, b = UnsafeSearcher("a", 3), UnsafeSearcher("b", 5)
    searchers = {"a": a, "b": b, "hybrid": HybridSearcher([a, b], depth=4)}
    plan = [(name, [f"{name} q{i} {j}" for j in range(1 + i % 3)], 1 + i % 3) for i in range(30) for name in searchers]
    want = [expected(searchers[n], qs, k) for n, qs, k in plan]
    a.max_inside = b.max_inside = 0
    with serve_in_thread([], searchers=searchers, cache_size=0, batch_window_ms=1.0) as h:

        def call(job):
            name, qs, k = job
            r = httpx.post(h.url + "/retrieve", json={"queries": qs, "topk": k, "index": name}, timeout=60)
            assert r.status_code == 200, r.text
            return [[(d["document"]["id"], round(d["score"], 9)) for d in row] for row in r.json()["result"]]

        with ThreadPoolExecutor(max_workers=16) as pool:
            got = list(pool.map(call, plan))
    assert got == want
    assert a.max_inside == 1 and b.max_inside == 1


@pytest.fixture(scope="module")
def real_indexes(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("hyb")
    corpus = write_toy_corpus(root / "corpus.jsonl")
    build_bm25(corpus, root / "bm25", show_progress=False)
    enc = Encoder(str(make_tiny_encoder(root / "tiny-bert")), family="sbert", device="cpu")
    build_dense(corpus, root / "dense", enc, show_progress=False)
    return [root / "bm25", root / "dense"]


def test_real_bm25_dense_hybrid_under_concurrency_match_sequential(real_indexes):
    """bm25s + a torch encoder + faiss behind the service, hammered on all three indexes at once."""
    words = sorted({w for t, x in TOY_PASSAGES for w in (t + " " + x).replace(".", "").split()})
    plan = [(name, [" ".join(words[(i * 7 + j) % len(words)] for j in range(3)), f"{words[i % len(words)]} {i}"], 3)
            for i in range(24) for name in ("bm25", "dense", "hybrid")]
    local = load_searchers(real_indexes, _cfg(hybrid=True))
    want = [[[p.id for p in ps] for ps in local[n].search(qs, k)] for n, qs, k in plan]
    with serve_in_thread(real_indexes, hybrid=True, bm25_backend="numpy", cache_size=0, batch_window_ms=1.0) as h:

        def call(job):
            name, qs, k = job
            r = httpx.post(h.url + "/retrieve", json={"queries": qs, "topk": k, "index": name}, timeout=60)
            assert r.status_code == 200, r.text
            return [[d["document"]["id"] for d in row] for row in r.json()["result"]]

        with ThreadPoolExecutor(max_workers=12) as pool:
            got = list(pool.map(call, plan))
    assert got == want


def _cfg(**kw):
    from r3rag.retrieval.config import ServiceConfig

    return ServiceConfig(bm25_backend="numpy", **kw)

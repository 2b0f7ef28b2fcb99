"""Reliability under load: 10,000 requests from 32 concurrent clients, zero errors, exact stats."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from r3rag.retrieval.bm25_index import build_bm25
from r3rag.retrieval.service import serve_in_thread
from r3rag.retrieval.testing import TOY_PASSAGES, write_toy_corpus

N_REQUESTS = 10_000
N_CLIENTS = 32


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ten_thousand_requests_from_32_clients(tmp_path):
    build_bm25(write_toy_corpus(tmp_path / "corpus.jsonl"), tmp_path / "bm25", show_progress=False)
    words = sorted({w for t, x in TOY_PASSAGES for w in (t + " " + x).replace(".", "").split()})
    rng = random.Random(0)
    plan = []  # (dialect, body, n_queries, k)
    for i in range(N_REQUESTS):
        n = rng.randint(1, 4)
        k = rng.randint(1, 5)
        qs = [" ".join(rng.sample(words, 3)) + f" {i}" for _ in range(n)]
        dialect = ("/retrieve", "/search", "/queries")[i % 3]
        body = {"/retrieve": {"queries": qs, "topk": k, "return_scores": i % 2 == 0},
                "/search": {"querys": qs, "topk": k}, "/queries": {"queries": qs, "k": k}}[dialect]
        plan.append((dialect, body, n, k))

    def well_formed(dialect: str, body: dict, n: int, k: int, data) -> bool:
        if dialect == "/retrieve":
            rows = data["result"]
            ok_items = all(("document" in d and "score" in d) if body["return_scores"] else set(d) == {"id", "contents"}
                           for r in rows for d in r)
            return len(rows) == n and all(len(r) == k for r in rows) and ok_items
        if dialect == "/search":
            return len(data) == n and all(len(r) == k and all(set(d) == {"id", "contents"} for d in r) for r in data)
        return data["queries"] == body["queries"] and len(data["answers"]) == n and all(len(a) == k for a in data["answers"])

    with serve_in_thread(tmp_path / "bm25", bm25_backend="numpy", cache_size=1000) as server:

        async def run() -> list[str]:
            failures: list[str] = []
            queue = list(enumerate(plan))

            async def worker() -> None:  # one client (one keep-alive connection) per simulated user
                async with httpx.AsyncClient(timeout=60) as client:
                    while queue:
                        i, (dialect, body, n, k) = queue.pop()
                        try:
                            r = await client.post(server.url + dialect, json=body)
                            if r.status_code != 200 or not well_formed(dialect, body, n, k, r.json()):
                                failures.append(f"{i}: {r.status_code} {r.text[:200]}")
                        except httpx.HTTPError as err:
                            failures.append(f"{i}: {type(err).__name__}")

            await asyncio.gather(*(worker() for _ in range(N_CLIENTS)))
            return failures

        failures = asyncio.run(run())
        assert failures == []
        stats = httpx.get(server.url + "/stats").json()
        assert stats["requests"] == N_REQUESTS
        assert stats["queries"] == sum(n for _, _, n, _ in plan)
        assert stats["errors"] == 0
        assert stats["cache_hits"] + stats["cache_misses"] == stats["queries"]
        by = stats["requests_by_endpoint"]
        assert (by["/retrieve"], by["/search"], by["/queries"]) == (3334, 3333, 3333)
        assert httpx.get(server.url + "/health").status_code == 200

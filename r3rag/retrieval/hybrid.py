"""Hybrid retrieval by reciprocal rank fusion (RRF).

Each member searcher returns its top ``depth`` passages; a passage's fused score is
``sum over members of 1 / (rrf_k + rank)`` with ranks starting at 1 (Cormack et al., 2009;
``rrf_k = 60`` by default). Passages are matched by id, so members may use different methods
(BM25 and dense) over the same corpus. Ties keep the order of first appearance.

Members are called through :func:`~r3rag.retrieval.locks.locked_search`: in the service each
member is also searched by its own batcher's thread, and the hybrid's thread must not enter a
member while that thread is inside it (see :mod:`r3rag.retrieval.locks`).
"""

from __future__ import annotations

from r3rag.data.records import Passage
from r3rag.retrieval.locks import locked_search
from r3rag.retrieval.searcher import Searcher


def rrf_fuse(rankings: list[list[Passage]], k: int, rrf_k: float = 60.0) -> list[Passage]:
    """Fuse ranked lists of passages into one list of ``k``, each scored by RRF."""
    scores: dict[str, float] = {}
    first: dict[str, Passage] = {}
    for ranking in rankings:
        for rank, p in enumerate(ranking, start=1):
            scores[p.id] = scores.get(p.id, 0.0) + 1.0 / (rrf_k + rank)
            first.setdefault(p.id, p)
    order = sorted(scores, key=lambda pid: -scores[pid])  # stable: ties keep first appearance
    return [Passage(id=pid, contents=first[pid].contents, score=scores[pid]) for pid in order[:k]]


class HybridSearcher(Searcher):
    """RRF over several searchers: ``HybridSearcher([bm25, dense]).search(queries, k)``."""

    kind = "hybrid"

    def __init__(self, members: list[Searcher], name: str = "hybrid", rrf_k: float = 60.0, depth: int = 50):
        if len(members) < 2:
            raise ValueError("hybrid retrieval needs at least two searchers")
        self.members = members
        self.name = name
        self.rrf_k = rrf_k
        self.depth = depth

    @property
    def size(self) -> int:
        return max(m.size for m in self.members)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        depth = max(k, self.depth)
        per_member = [locked_search(m, queries, depth) for m in self.members]
        return [rrf_fuse([res[i] for res in per_member], k, self.rrf_k) for i in range(len(queries))]

    def describe(self) -> dict:
        return {**super().describe(), "members": [m.name for m in self.members], "rrf_k": self.rrf_k}

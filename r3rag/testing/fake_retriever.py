"""An in-memory retriever for tests: word-overlap scoring, call counting, optional failure.

Implements the rollout's retriever protocol (``async asearch(queries, k)``) so engine tests need
no index and no server. Score = number of distinct query words (lower-cased, alphanumeric) that
occur in the passage; ties keep corpus order.
"""

from __future__ import annotations

import re

from r3rag.data.records import Passage

_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower()))


class OverlapRetriever:
    def __init__(self, passages: list[Passage], fail: bool = False) -> None:
        self.passages = passages
        self._words = [_words(p.contents) for p in passages]
        self.fail = fail
        self.calls: list[tuple[list[str], int]] = []

    async def asearch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append((list(queries), k))
        if self.fail:
            raise ConnectionError("retriever is down (test)")
        return self.search(queries, k)

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        out = []
        for q in queries:
            qw = _words(q)
            scored = [(len(qw & w), i) for i, w in enumerate(self._words)]
            scored = [x for x in scored if x[0] > 0]
            scored.sort(key=lambda x: (-x[0], x[1]))
            out.append([Passage(self.passages[i].id, self.passages[i].contents, float(s)) for s, i in scored[:k]])
        return out

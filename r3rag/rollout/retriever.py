"""How the engine reaches a retriever: one ``asearch(queries, k)`` call per round.

Anything with ``async asearch(queries: list[str], k: int) -> list[list[Passage]]`` that raises on
failure works; the real one is :class:`r3rag.retrieval.client.RetrievalClient` (HTTP service).
:class:`SearcherRetriever` adapts an in-process searcher (``search(queries, k)``, e.g.
``r3rag.retrieval.searcher.load_searcher(dir)``) without a server.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

from r3rag.data.records import Passage


@runtime_checkable
class Retriever(Protocol):
    async def asearch(self, queries: list[str], k: int) -> list[list[Passage]]: ...


class SearcherRetriever:
    """Wrap a synchronous ``search(queries, k)`` object as an async retriever (counts calls)."""

    def __init__(self, searcher: Any, in_thread: bool = False) -> None:
        self.searcher = searcher
        self.in_thread = in_thread
        self.calls = 0
        self.queries = 0

    async def asearch(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls += 1
        self.queries += len(queries)
        if self.in_thread:
            return await asyncio.to_thread(self.searcher.search, queries, k)
        return self.searcher.search(queries, k)

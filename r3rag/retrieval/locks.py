"""One lock per searcher: the rule that makes sharing a searcher between threads safe.

In the service every index has its own :class:`~r3rag.retrieval.batcher.MicroBatcher`, whose
worker thread calls that index's ``search``. The ``hybrid`` index has one too, and its thread
calls *the same member objects* (BM25, dense, or their reranked wrappers). So a member can be
searched from two threads at once, and the searchers underneath are not documented as
thread-safe: a torch encoder with its tokenizer, a faiss index whose ``efSearch``/``nprobe`` is a
property of the index object, bm25s with its numba/numpy state, a cross-encoder. Rather than
audit each of them (and each one added later), every caller that may share a searcher goes
through :func:`locked_search`, which holds that searcher's own re-entrant lock for the call.

Only calls on the *same* searcher are serialised; BM25 and dense still run in parallel with
each other. Locks are only taken outer to inner: the hybrid's thread holds the hybrid's lock and
then one member's lock at a time (never two members' together), and nothing holding a member's
lock ever waits for the hybrid's, so there is no lock cycle. The cost: a hybrid batch waits for the member batch already running on that member, which
is the same CPU work it would otherwise contend with.
"""

from __future__ import annotations

import threading

from r3rag.data.records import Passage
from r3rag.retrieval.searcher import Searcher

_ATTR = "_r3rag_search_lock"
_CREATE = threading.Lock()


def search_lock(searcher: Searcher) -> threading.RLock:
    """The re-entrant lock that serialises calls of ``searcher.search`` (made on first use)."""
    lock = getattr(searcher, _ATTR, None)
    if lock is None:
        with _CREATE:
            lock = getattr(searcher, _ATTR, None)
            if lock is None:
                lock = threading.RLock()
                setattr(searcher, _ATTR, lock)
    return lock


def locked_search(searcher: Searcher, queries: list[str], k: int) -> list[list[Passage]]:
    """``searcher.search(queries, k)`` while holding that searcher's lock."""
    with search_lock(searcher):
        return searcher.search(queries, k)

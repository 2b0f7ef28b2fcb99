"""The searcher interface and :func:`load_searcher`, the one way to open an index directory.

A :class:`Searcher` answers a batch of queries with ``k`` passages each. Index-backed searchers
(:class:`RowSearcher`) find corpus *rows* (row i = corpus line i) and resolve them to passages
through a memory-mapped :class:`~r3rag.retrieval.corpus.CorpusStore`. Methods are looked up by
name in :data:`LOADERS`, filled by the modules that implement them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

import numpy as np

from r3rag.data.records import Passage
from r3rag.retrieval.corpus import CorpusStore
from r3rag.retrieval.manifest import IndexError_, Manifest, read_manifest


class Searcher(ABC):
    """Batch search: ``search(queries, k) -> one list of up to k passages per query``."""

    name: str = "searcher"
    kind: str = "abstract"

    @abstractmethod
    def search(self, queries: list[str], k: int) -> list[list[Passage]]: ...

    @property
    @abstractmethod
    def size(self) -> int:
        """Number of passages searched."""

    def describe(self) -> dict:
        return {"name": self.name, "kind": self.kind, "passages": self.size}

    def close(self) -> None:  # pragma: no cover - default has nothing to free
        pass


class RowSearcher(Searcher):
    """A searcher over corpus rows; subclasses implement :meth:`search_rows`."""

    def __init__(self, manifest: Manifest, store: CorpusStore) -> None:
        self.manifest = manifest
        self.store = store
        self.name = manifest.name
        self.kind = manifest.method

    @property
    def size(self) -> int:
        return len(self.store)

    @abstractmethod
    def search_rows(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per query, the row numbers and scores of the top ``k`` passages, best first."""

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        if not queries:
            return []
        rows, scores = self.search_rows(queries, k)
        # one corpus look-up for the whole batch (the per-call checks cost more than the lines)
        flat = self.store.get(np.concatenate(rows).tolist(), np.concatenate(scores).tolist())
        out, pos = [], 0
        for r in rows:
            out.append(flat[pos : pos + len(r)])
            pos += len(r)
        return out

    def close(self) -> None:
        self.store.close()


def open_corpus(index_dir: Path, manifest: Manifest) -> CorpusStore:
    """The corpus an index was built from, checked against the manifest's size and line count."""
    path = Path(manifest.corpus.path)
    if not path.is_absolute():
        path = (index_dir / path).resolve()
    if not path.is_file():
        raise IndexError_(f"{index_dir}: corpus {path} (from the manifest) not found")
    if path.stat().st_size != manifest.corpus.bytes:
        raise IndexError_(
            f"{index_dir}: corpus {path} has {path.stat().st_size} bytes but the index was built "
            f"from {manifest.corpus.bytes}; rebuild the index"
        )
    offsets_path = index_dir / "offsets.npy"
    offsets = np.load(offsets_path, mmap_mode="r") if offsets_path.is_file() else None
    store = CorpusStore(path, offsets)
    if len(store) != manifest.corpus.num_passages:
        raise IndexError_(f"{index_dir}: corpus has {len(store)} lines, manifest says {manifest.corpus.num_passages}")
    return store


Loader = Callable[[Path, Manifest, CorpusStore], RowSearcher]
LOADERS: dict[str, Loader] = {}


def register_loader(method: str) -> Callable[[Loader], Loader]:
    def deco(fn: Loader) -> Loader:
        LOADERS[method] = fn
        return fn

    return deco


def load_searcher(index_dir: str | Path, **options) -> RowSearcher:
    """Open an index directory written by ``tool/build_index.py`` (reads its manifest).

    ``options`` override search-time settings of the method (``ef_search``, ``nprobe``,
    ``device``, ``batch_size`` for dense; ``backend`` for BM25).
    """
    import r3rag.retrieval.bm25_index  # noqa: F401  (registers "bm25")
    import r3rag.retrieval.dense_index  # noqa: F401  (registers "dense")

    index_dir = Path(index_dir)
    manifest = read_manifest(index_dir)
    store = open_corpus(index_dir, manifest)
    return LOADERS[manifest.method](index_dir, manifest, store, **options)

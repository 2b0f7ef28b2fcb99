"""BM25 indexes with bm25s: build from a corpus JSONL, search in batches.

Tokenisation is :class:`r3rag.retrieval.tokenize.Tokenizer` on both sides. bm25s stores the
BM25 score of every (term, document) pair in a sparse matrix, so a query costs one column
gather per query term plus a top-k selection; the numba backend (when importable) runs that
loop compiled. A query none of whose terms is in the vocabulary scores 0 on every passage and
gets the first ``k`` rows with score 0, like bm25s's own empty-token convention.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from r3rag.retrieval.corpus import iter_corpus, line_offsets, require_corpus
from r3rag.retrieval.manifest import BM25Info, CorpusInfo, Manifest, file_sha256
from r3rag.retrieval.searcher import RowSearcher, register_loader
from r3rag.retrieval.tokenize import Tokenizer

BM25_SUBDIR = "bm25"


def numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(backend: str) -> str:
    if backend == "auto":
        return "numba" if numba_available() else "numpy"
    return backend


def build_bm25(
    corpus_path: str | Path,
    out_dir: str | Path,
    info: BM25Info | None = None,
    name: str | None = None,
    show_progress: bool = True,
) -> Manifest:
    """Index ``corpus_path`` into ``out_dir`` and write its manifest."""
    import bm25s
    from bm25s.tokenization import Tokenized

    info = info or BM25Info()
    start = time.perf_counter()
    corpus_path = require_corpus(corpus_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(stemmer=info.stemmer, stopwords=info.stopwords, lower=info.lower)
    vocab: dict[str, int] = {}
    doc_ids: list[list[int]] = []
    for p in tqdm(iter_corpus(corpus_path), desc="tokenize", unit="psg", disable=not show_progress):
        doc_ids.append([vocab.setdefault(t, len(vocab)) for t in tok(p.contents)])
    if not doc_ids:
        from r3rag.errors import DataError

        raise DataError(f"{corpus_path}: corpus is empty")
    retriever = bm25s.BM25(k1=info.k1, b=info.b, method=info.variant, backend=resolve_backend(info.backend))
    retriever.index(Tokenized(ids=doc_ids, vocab=vocab), show_progress=show_progress)
    retriever.save(str(out_dir / BM25_SUBDIR), show_progress=False)
    np.save(out_dir / "offsets.npy", line_offsets(corpus_path))
    manifest = Manifest(
        name=name or out_dir.name,
        method="bm25",
        corpus=CorpusInfo(
            path=str(corpus_path),
            bytes=corpus_path.stat().st_size,
            sha256=file_sha256(corpus_path),
            num_passages=len(doc_ids),
        ),
        bm25=info,
        build_seconds=round(time.perf_counter() - start, 3),
    )
    manifest.save(out_dir)
    return manifest


class BM25Searcher(RowSearcher):
    """Batch BM25 search over a bm25s index (optionally memory-mapped)."""

    def __init__(self, index_dir: Path, manifest: Manifest, store, backend: str | None = None, mmap: bool = False):
        import bm25s

        super().__init__(manifest, store)
        info = manifest.bm25 or BM25Info()
        self.backend = resolve_backend(backend or info.backend)
        self.tokenizer = Tokenizer(stemmer=info.stemmer, stopwords=info.stopwords, lower=info.lower)
        self.retriever = bm25s.BM25.load(
            str(index_dir / BM25_SUBDIR), mmap=mmap, load_vocab=True, show_progress=False,
            override_params={"backend": self.backend},
        )
        self.retriever.backend = self.backend
        self.vocab: dict[str, int] = self.retriever.vocab_dict
        if self.backend == "numba" and self.vocab:
            # numba compiles on first use (seconds to tens of seconds): pay it at load, not on
            # the first request, where it would look like a hung server to a client's timeout.
            self.retriever.retrieve([[next(iter(self.vocab.values()))]], k=1, show_progress=False)

    def query_token_ids(self, queries: list[str]) -> list[list[int]]:
        vocab = self.vocab
        return [[vocab[t] for t in self.tokenizer(q) if t in vocab] for q in queries]

    def search_rows(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        k = max(1, min(int(k), self.size))
        ids = self.query_token_ids(queries)
        rows: list[np.ndarray] = [np.arange(k, dtype=np.int64)] * len(queries)
        scores: list[np.ndarray] = [np.zeros(k, dtype=np.float32)] * len(queries)
        known = [i for i, t in enumerate(ids) if t]
        if known:
            docs, sc = self.retriever.retrieve([ids[i] for i in known], k=k, show_progress=False, n_threads=0)
            for j, i in enumerate(known):
                rows[i], scores[i] = np.asarray(docs[j]), np.asarray(sc[j])
        return rows, scores


@register_loader("bm25")
def _load_bm25(index_dir: Path, manifest: Manifest, store, **options) -> BM25Searcher:
    """Options: ``backend`` ("numba"/"numpy"/"auto"), ``mmap`` (or ``bm25_mmap``); others are ignored."""
    mmap = options.get("bm25_mmap", options.get("mmap", False))
    return BM25Searcher(index_dir, manifest, store, backend=options.get("backend"), mmap=bool(mmap))

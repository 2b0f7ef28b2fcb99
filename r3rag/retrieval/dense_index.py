"""Dense indexes: encode a corpus in chunks into a faiss index, search by inner product.

Vectors are L2-normalised, so inner product is cosine similarity. The layout is a faiss
factory string: ``Flat`` (exact), ``HNSW32`` (graph, approximate, ``efSearch`` at query time),
``IVF<n>,PQ<m>`` (inverted lists of product-quantised codes, ``nprobe`` at query time).
``fp16`` stores vectors as half floats (``Flat`` -> ``SQfp16``, ``HNSW32`` -> ``HNSW32,SQfp16``),
halving memory. Encoding runs in chunks so memory stays bounded by one chunk (plus the
training sample for layouts that need training, such as IVF). Row i of the index is line i of
the corpus, as in FlashRAG, so a FlashRAG-built index can be wrapped with a manifest
(:func:`import_faiss_index`) and served as it is.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Iterator

import numpy as np
from tqdm import tqdm

from r3rag.errors import R3RagError
from r3rag.retrieval.corpus import iter_corpus, line_offsets, require_corpus
from r3rag.retrieval.encoders import Encoder
from r3rag.retrieval.manifest import CorpusInfo, DenseInfo, Manifest, file_sha256
from r3rag.retrieval.searcher import RowSearcher, register_loader


def resolve_factory(factory: str, fp16: bool) -> str:
    """The faiss factory string actually built (fp16 storage folded in where it applies)."""
    if not fp16:
        return factory
    if factory == "Flat":
        return "SQfp16"
    if factory.startswith("HNSW") and "," not in factory:
        return f"{factory},SQfp16"
    raise R3RagError(f"--fp16 applies to Flat and HNSW<M> layouts, not {factory!r} (PQ is already compressed)")


def make_index(dim: int, factory: str):
    import faiss

    try:
        return faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise R3RagError(f"invalid faiss factory string {factory!r}: {str(err).splitlines()[-1]}") from None


def _chunks(corpus_path: Path, size: int) -> Iterator[list[str]]:
    buf: list[str] = []
    for p in iter_corpus(corpus_path):
        buf.append(p.contents)
        if len(buf) == size:
            yield buf
            buf = []
    if buf:
        yield buf


def build_dense(
    corpus_path: str | Path,
    out_dir: str | Path,
    encoder: Encoder,
    factory: str = "Flat",
    fp16: bool = False,
    chunk_size: int = 4096,
    train_size: int = 65536,
    name: str | None = None,
    show_progress: bool = True,
) -> Manifest:
    """Encode every passage of ``corpus_path`` and write ``dense.index`` plus the manifest."""
    import faiss

    start = time.perf_counter()
    corpus_path = require_corpus(corpus_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = resolve_factory(factory, fp16)
    index = make_index(encoder.dim, built)
    offsets = line_offsets(corpus_path)
    total = len(offsets) - 1
    if total == 0:
        raise R3RagError(f"{corpus_path}: corpus is empty")
    pending: list[np.ndarray] = []  # vectors held back until an untrained index is trained
    bar = tqdm(total=total, desc="encode", unit="psg", disable=not show_progress)
    for texts in _chunks(corpus_path, chunk_size):
        vecs = encoder.encode(texts, "passage")
        bar.update(len(texts))
        if index.is_trained:
            index.add(vecs)
            continue
        pending.append(vecs)
        held = sum(len(v) for v in pending)
        if held >= train_size or held == total:
            sample = np.concatenate(pending)
            index.train(sample)
            index.add(sample)
            pending = []
    if pending:
        sample = np.concatenate(pending)
        try:
            index.train(sample)
        except RuntimeError as err:
            raise R3RagError(f"cannot train {built!r} on {len(sample)} vectors: {str(err).splitlines()[-1]}") from None
        index.add(sample)
    bar.close()
    faiss.write_index(index, str(out_dir / "dense.index"))
    np.save(out_dir / "offsets.npy", offsets)
    manifest = Manifest(
        name=name or out_dir.name,
        method="dense",
        corpus=CorpusInfo(path=str(corpus_path), bytes=corpus_path.stat().st_size,
                          sha256=file_sha256(corpus_path), num_passages=total),
        dense=DenseInfo(**encoder.settings(), factory=built, fp16=fp16),
        build_seconds=round(time.perf_counter() - start, 3),
    )
    manifest.save(out_dir)
    return manifest


def import_faiss_index(
    index_file: str | Path, corpus_path: str | Path, out_dir: str | Path, encoder: Encoder, name: str | None = None
) -> Manifest:
    """Wrap an existing faiss index (e.g. FlashRAG's ``e5_Flat.index``) with a manifest."""
    import faiss

    corpus_path = require_corpus(corpus_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    index = faiss.read_index(str(index_file))
    offsets = line_offsets(corpus_path)
    if index.ntotal != len(offsets) - 1:
        raise R3RagError(f"{index_file}: {index.ntotal} vectors but {corpus_path} has {len(offsets) - 1} lines")
    if index.d != encoder.dim:
        raise R3RagError(f"{index_file}: dimension {index.d} but encoder {encoder.model_name} gives {encoder.dim}")
    shutil.copyfile(index_file, out_dir / "dense.index")
    np.save(out_dir / "offsets.npy", offsets)
    manifest = Manifest(
        name=name or out_dir.name,
        method="dense",
        corpus=CorpusInfo(path=str(corpus_path), bytes=corpus_path.stat().st_size,
                          sha256=file_sha256(corpus_path), num_passages=index.ntotal),
        dense=DenseInfo(**encoder.settings(), factory=f"imported:{Path(index_file).name}"),
    )
    manifest.save(out_dir)
    return manifest


class DenseSearcher(RowSearcher):
    """Encode queries with the manifest's encoder settings, search the faiss index."""

    def __init__(self, index_dir: Path, manifest: Manifest, store, ef_search: int | None = None,
                 nprobe: int | None = None, device: str | None = None, batch_size: int = 64,
                 encoder: Encoder | None = None):
        import faiss

        super().__init__(manifest, store)
        info = manifest.dense
        assert info is not None
        self.info = info
        self.index = faiss.read_index(str(index_dir / info.index_file))
        if self.index.ntotal != len(store):
            raise R3RagError(f"{index_dir}: index holds {self.index.ntotal} vectors, corpus {len(store)}")
        self.set_params(ef_search or info.ef_search, nprobe or info.nprobe)
        self.encoder = encoder or Encoder(
            info.encoder, family=info.family, pooling=info.pooling, query_prefix=info.query_prefix,
            passage_prefix=info.passage_prefix, max_length=info.max_length, batch_size=batch_size,
            device=device, normalize=info.normalize,
        )

    def set_params(self, ef_search: int, nprobe: int) -> None:
        import faiss

        space = faiss.ParameterSpace()
        for param, value in (("efSearch", ef_search), ("nprobe", nprobe)):
            try:
                space.set_index_parameter(self.index, param, int(value))
            except RuntimeError:
                pass  # the layout has no such parameter (e.g. efSearch on Flat)

    def search_vectors(self, vecs: np.ndarray, k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        k = max(1, min(int(k), self.size))
        scores, rows = self.index.search(np.ascontiguousarray(vecs, dtype=np.float32), k)
        keep = [r >= 0 for r in rows]  # approximate layouts may return fewer than k (-1 rows)
        return [r[m] for r, m in zip(rows, keep)], [s[m] for s, m in zip(scores, keep)]

    def search_rows(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self.search_vectors(self.encoder.encode(queries, "query"), k)


@register_loader("dense")
def _load_dense(index_dir: Path, manifest: Manifest, store, **options) -> DenseSearcher:
    """Options: ``ef_search``, ``nprobe``, ``device``, ``batch_size``, ``encoder``; others are ignored."""
    keep = ("ef_search", "nprobe", "device", "batch_size", "encoder")
    return DenseSearcher(index_dir, manifest, store, **{k: v for k, v in options.items() if k in keep})

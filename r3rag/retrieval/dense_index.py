"""Dense indexes: encode a corpus into vector shards, build a faiss layout from them, search.

Vectors are L2-normalised, so inner product is cosine similarity. Building has two stages:

1. *encode* (:mod:`r3rag.retrieval.shards`): the corpus is streamed into fp16 shard files under
   ``INDEX/vectors`` (resumable after a kill, one process per GPU);
2. *index*: a faiss layout is built from the memory-mapped shards. The layout is a faiss factory
   string: ``Flat`` (exact), ``HNSW32`` (graph, ``efSearch`` at query time), ``IVF<n>,PQ<m>``
   (inverted lists of product-quantised codes, ``nprobe`` at query time; trained on a uniform
   sample of ``train_size`` vectors, then filled block by block). ``fp16`` stores vectors as
   half floats (``Flat`` -> ``SQfp16``, ``HNSW32`` -> ``HNSW32,SQfp16``).

Searching: the index file is memory-mapped where faiss allows (``IO_FLAG_MMAP_IFC``), so the
process holds little more than the page cache it touches; or copied to every GPU (sharded, fp16)
with ``faiss_gpu``. Compressed layouts are *refined*: the top ``refine_k`` candidates of the
approximate search are re-scored exactly against the stored fp16 vectors (memory-mapped, read
only for those rows) and the best ``k`` returned, so recall against exact search depends only on
the true neighbours reaching the candidate list, and the resident memory is that of the codes.

Row i of the index is line i of the corpus, as in FlashRAG, so a FlashRAG-built index can be
wrapped with a manifest (:func:`import_faiss_index`) and served as it is. The manifest stores a
probe of the encoder (:meth:`~r3rag.retrieval.encoders.Encoder.probe`): a server given another
encoder refuses to start.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from r3rag.errors import R3RagError
from r3rag.retrieval.corpus import require_corpus, write_line_offsets
from r3rag.retrieval.encoders import PROBE_MIN_COSINE, Encoder
from r3rag.retrieval.manifest import MANIFEST_NAME, CorpusInfo, DenseInfo, IndexError_, Manifest, file_sha256
from r3rag.retrieval.resources import check_disk, check_memory
from r3rag.retrieval.searcher import RowSearcher, register_loader
from r3rag.retrieval.shards import (DTYPES, SPEC_NAME, EncodeSpec, VectorStore, copy_shards_from_faiss, done_shards,
                                    encode_shards, shard_bytes)

VECTORS_SUBDIR = "vectors"
DEFAULT_SHARD_SIZE = 100_000
REFINE_K = 100


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
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise R3RagError(f"invalid faiss factory string {factory!r}: {str(err).splitlines()[-1]}") from None
    # index_factory turns on polysemous training for PQ layouts (unless the string ends in "np"):
    # an extra optimisation of the codes for Hamming-distance filtering, which this project never
    # uses, that costs minutes even on tiny samples (~0.2 s per k-means iteration here).
    for sub in (index, _ivf_or_none(index)):
        if sub is not None and hasattr(sub, "do_polysemous_training"):
            sub.do_polysemous_training = False
    return index


def _ivf_or_none(index):
    import faiss

    try:
        return faiss.downcast_index(faiss.extract_index_ivf(index))
    except RuntimeError:
        return None


def _write_index_atomic(index, path: Path) -> None:
    import faiss

    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        faiss.write_index(index, str(tmp))
        os.replace(tmp, path)
    except (OSError, RuntimeError) as err:
        tmp.unlink(missing_ok=True)
        raise R3RagError(f"writing {path} failed: {str(err).splitlines()[-1]}") from None


def build_faiss(store: VectorStore, factory: str, train_size: int = 65536, show_progress: bool = True):
    """A faiss index of every vector in ``store``, added block by block from the memory-mapped
    shards; layouts that need training (IVF, PQ) are first trained on ``train_size`` vectors
    drawn uniformly from the whole store, so only the sample and the index are ever in memory."""
    index = make_index(store.dim, factory)
    if not index.is_trained:
        sample = store.sample(train_size)
        try:
            index.train(sample)
        except RuntimeError as err:
            raise R3RagError(f"cannot train {factory!r} on {len(sample)} vectors: {str(err).splitlines()[-1]}; "
                             "raise --train-size or choose fewer lists / centroids") from None
        del sample
    with tqdm(total=len(store), desc=f"add {factory}", unit="vec", disable=not show_progress) as bar:
        for _, block in store.iter_blocks():
            try:
                index.add(block)
            except (MemoryError, RuntimeError) as err:
                raise R3RagError(f"adding vectors to {factory!r} failed at {index.ntotal} of {len(store)}: "
                                 f"{str(err).splitlines()[-1]}; see tool/build_index.py --plan for the memory it needs") from None
            bar.update(len(block))
    return index


def default_refine_k(factory: str) -> int:
    """Candidates re-scored exactly from the stored vectors by default: PQ and the 8/4/6-bit
    scalar quantisers lose precision, so they get :data:`REFINE_K`; exact layouts need none."""
    lossy = "PQ" in factory or any(q in factory for q in ("SQ8", "SQ4", "SQ6", "LSH", "RaBitQ"))
    return REFINE_K if lossy else 0


def _corpus_info(corpus_path: Path, num_passages: int) -> CorpusInfo:
    return CorpusInfo(path=str(corpus_path), bytes=corpus_path.stat().st_size, sha256=file_sha256(corpus_path),
                      num_passages=num_passages)


def _offsets_for(corpus_path: Path, out_dir: Path) -> np.ndarray:
    """The corpus's line offsets in ``out_dir/offsets.npy`` (reused when they match its size)."""
    path = out_dir / "offsets.npy"
    if path.is_file():
        try:
            offsets = np.load(path, mmap_mode="r")
            if len(offsets) and int(offsets[-1]) == corpus_path.stat().st_size:
                return offsets
        except (OSError, ValueError):
            pass
    return write_line_offsets(corpus_path, path)


def build_dense(
    corpus_path: str | Path,
    out_dir: str | Path,
    encoder=None,
    factory: str = "Flat",
    fp16: bool = False,
    chunk_size: int = 4096,
    train_size: int = 65536,
    name: str | None = None,
    show_progress: bool = True,
    shard_size: int = DEFAULT_SHARD_SIZE,
    vectors_dtype: str = "float16",
    devices: list[str] | None = None,
    encoder_kwargs: dict | None = None,
    stage: str = "all",
    fresh: bool = False,
    refine_k: int | None = None,
    keep_vectors: bool = True,
    on_shard_done=None,
    check_resources: bool = True,
    threads: int | None = None,
    vectors_from: str | Path | None = None,
    nprobe: int | None = None,
) -> Manifest | None:
    """Encode ``corpus_path`` into vector shards (``out_dir/vectors``, resumable), then build the
    faiss layout ``factory`` from them and write ``dense.index`` and the manifest.

    ``stage``: ``encode`` (shards only), ``index`` (faiss from existing shards), or ``all``.
    The manifest is removed first and written last, so a directory without one is never served.
    ``encoder`` runs in this process; with several ``devices`` each device gets a process that
    builds its encoder from ``encoder_kwargs`` (default: ``encoder.init_kwargs()``).
    ``vectors_from``: take the vectors from an existing Flat faiss index (e.g. Search-R1's
    ``e5_Flat.index``, memory-mapped) instead of encoding; ``encoder`` must be the one that made
    it (checked on the first passages) and is recorded in the manifest.
    Returns the manifest (None for ``stage="encode"``)."""
    from r3rag.retrieval.plan import build_requirements

    start = time.perf_counter()
    corpus_path = require_corpus(corpus_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    built = resolve_factory(factory, fp16)
    vec_dir = out_dir / VECTORS_SUBDIR
    if vectors_dtype not in DTYPES:
        raise R3RagError(f"--vectors-dtype must be one of {', '.join(DTYPES)}, not {vectors_dtype!r}")
    if encoder is None and encoder_kwargs is None:
        if stage != "index":
            raise R3RagError("encoding needs an encoder (--model)")
    offsets = _offsets_for(corpus_path, out_dir)
    total = len(offsets) - 1
    if total == 0:
        raise R3RagError(f"{corpus_path}: corpus is empty")
    if stage in ("encode", "all"):
        settings = encoder.settings() if encoder is not None else None
        if settings is None:
            from r3rag.retrieval.encoders import Encoder

            encoder = Encoder(**{**encoder_kwargs, "device": "cpu", "fp16": False})
            settings = encoder.settings()
        encode_dtype = "float16" if (encoder_kwargs or {}).get("fp16") or getattr(encoder, "fp16", False) else "float32"
        spec = EncodeSpec(corpus_path=str(corpus_path), corpus_bytes=corpus_path.stat().st_size, num_passages=total,
                          encoder={**settings, "encode_dtype": encode_dtype}, shard_size=shard_size,
                          dtype=vectors_dtype, dim=int(settings["dim"]))
        make_index(spec.dim, built)  # a bad factory string fails now, not after hours of encoding
        if check_resources:
            done = done_shards(vec_dir, spec) if (vec_dir / SPEC_NAME).is_file() and not fresh else set()
            left = sum(shard_bytes(spec, i) for i in range(spec.num_shards) if i not in done)
            req = build_requirements(total, spec.dim, built, vectors_dtype=vectors_dtype, train_size=train_size)
            need = left + (req["index_disk_bytes"] if stage == "all" else 0)
            check_disk(out_dir, need, f"encoding {total:,} passages ({spec.dim}-d, {vectors_dtype})"
                       + (f" and a {built} index" if stage == "all" else ""),
                       "free space, pick another --out, or lower it with --vectors-dtype float16 / a PQ --factory")
            if stage == "all":
                check_memory(req["build_ram_bytes"], f"building {built} over {total:,} x {spec.dim} vectors",
                             req["lower_ram_with"])
        multi = devices is not None and len(devices) > 1
        if vectors_from is not None:
            src = Path(vectors_from)
            if not src.is_file():
                raise R3RagError(f"{src}: faiss index not found")
            source, _ = read_index_mapped(src)
            if source.ntotal != total or source.d != spec.dim:
                raise IndexError_(f"{src}: {source.ntotal} vectors of {source.d}-d, but {corpus_path} has {total} lines "
                                  f"and the encoder gives {spec.dim}-d")
            _check_encoder_against_index(source, corpus_path, offsets, encoder, src)
            spec = EncodeSpec(**{**spec.__dict__, "encoder": {**spec.encoder, "encode_dtype": f"from:{src.name}"}})
            copy_shards_from_faiss(source, vec_dir, spec, fresh=fresh, show_progress=show_progress)
            del source
        else:
            encode_shards(corpus_path, out_dir / "offsets.npy", vec_dir, spec,
                          encoder=None if multi else encoder,
                          encoder_kwargs=encoder_kwargs or (encoder.init_kwargs() if hasattr(encoder, "init_kwargs") else None),
                          devices=devices, chunk_size=chunk_size, fresh=fresh, show_progress=show_progress,
                          on_shard_done=on_shard_done, threads=threads)
        if stage == "encode":
            return None
    store = VectorStore(vec_dir)
    if store.spec.num_passages != total or store.spec.corpus_bytes != corpus_path.stat().st_size:
        raise IndexError_(f"{vec_dir}: vectors of a corpus of {store.spec.num_passages} passages "
                          f"({store.spec.corpus_bytes} bytes), but {corpus_path} has {total} ({corpus_path.stat().st_size} bytes)")
    if check_resources:
        req = build_requirements(total, store.dim, built, vectors_dtype=store.spec.dtype, train_size=train_size)
        check_disk(out_dir, req["index_disk_bytes"], f"a {built} index over {total:,} vectors", req["lower_disk_with"])
        check_memory(req["build_ram_bytes"], f"building {built} over {total:,} x {store.dim} vectors", req["lower_ram_with"])
    index = build_faiss(store, built, train_size=train_size, show_progress=show_progress)
    _write_index_atomic(index, out_dir / "dense.index")
    enc_settings = {k: v for k, v in store.spec.encoder.items() if k != "encode_dtype"}
    probe = encoder.probe() if encoder is not None and hasattr(encoder, "probe") else []
    if refine_k is None:
        refine_k = default_refine_k(built)
    ivf = _ivf_or_none(index)
    if nprobe is None:
        from r3rag.retrieval.plan import default_nprobe

        nprobe = default_nprobe(ivf.nlist) if ivf is not None else DenseInfo.model_fields["nprobe"].default
    if not keep_vectors:
        import shutil

        shutil.rmtree(vec_dir)
        refine_k = 0
    manifest = Manifest(
        name=name or out_dir.name,
        method="dense",
        corpus=_corpus_info(corpus_path, total),
        dense=DenseInfo(**enc_settings, factory=built, fp16=fp16, probe=probe,
                        vectors_dir=VECTORS_SUBDIR if keep_vectors else None, refine_k=refine_k, nprobe=nprobe,
                        encode_dtype=store.spec.encoder.get("encode_dtype", "float32")),
        build_seconds=round(time.perf_counter() - start, 3),
    )
    del index
    manifest.save(out_dir)
    return manifest


def import_faiss_index(
    index_file: str | Path, corpus_path: str | Path, out_dir: str | Path, encoder: Encoder, name: str | None = None,
    link: bool = False,
) -> Manifest:
    """Wrap an existing faiss index (e.g. FlashRAG's ``e5_Flat.index``) with a manifest.

    Checks the row count against the corpus and, when the layout can give its vectors back
    (Flat), that ``encoder`` reproduces the stored vectors of the first passages: an index made
    with another encoder is refused here rather than served. ``link`` hard-links (or, across file
    systems, symlinks) the file instead of copying 60 GB."""
    import faiss

    corpus_path = require_corpus(corpus_path)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    index_file = Path(index_file)
    if not index_file.is_file():
        raise R3RagError(f"{index_file}: faiss index not found")
    try:
        index = faiss.read_index(str(index_file), _mmap_flag())
    except RuntimeError as err:
        raise R3RagError(f"{index_file}: not a readable faiss index ({str(err).splitlines()[-1]})") from None
    offsets = _offsets_for(corpus_path, out_dir)
    if index.ntotal != len(offsets) - 1:
        raise IndexError_(f"{index_file}: {index.ntotal} vectors but {corpus_path} has {len(offsets) - 1} lines")
    if index.d != encoder.dim:
        raise IndexError_(f"{index_file}: dimension {index.d} but encoder {encoder.model_name} gives {encoder.dim}")
    _check_encoder_against_index(index, corpus_path, offsets, encoder, index_file)
    target = out_dir / "dense.index"
    if target.resolve() != index_file.resolve():
        target.unlink(missing_ok=True)
        if link:
            try:
                os.link(index_file, target)
            except OSError:
                target.symlink_to(index_file.resolve())
        else:
            tmp = target.with_name(f"{target.name}.tmp.{os.getpid()}")
            shutil.copyfile(index_file, tmp)
            os.replace(tmp, target)
    manifest = Manifest(
        name=name or out_dir.name,
        method="dense",
        corpus=_corpus_info(corpus_path, index.ntotal),
        dense=DenseInfo(**encoder.settings(), factory=f"imported:{index_file.name}", probe=encoder.probe()),
    )
    manifest.save(out_dir)
    return manifest


def _check_encoder_against_index(index, corpus_path: Path, offsets: np.ndarray, encoder: Encoder, where: Path,
                                 rows: int = 4) -> None:
    """Re-encode the first ``rows`` passages and compare with the vectors the index stores."""
    n = min(rows, index.ntotal)
    try:
        stored = np.stack([index.reconstruct(i) for i in range(n)])
    except RuntimeError:
        return  # the layout cannot give vectors back (e.g. IVF without a direct map): nothing to compare
    from r3rag.retrieval.shards import iter_texts

    texts = next(iter_texts(corpus_path, offsets, 0, n, n))
    got = encoder.encode(texts, "passage")
    cos = np.sum(got * stored, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(stored, axis=1) + 1e-12)
    if float(cos.min()) < PROBE_MIN_COSINE:
        raise IndexError_(f"{where}: its vectors of the first passages differ from what {encoder.model_name} "
                          f"(pooling {encoder.pooling}, passage prefix {encoder.passage_prefix!r}) gives "
                          f"(cosine {float(cos.min()):.3f}); it was built with another encoder or another corpus order")


def _mmap_flag() -> int:
    import faiss

    return int(getattr(faiss, "IO_FLAG_MMAP_IFC", 0))


def read_index_mapped(path: Path):
    """``faiss.read_index`` with the stored vectors/codes memory-mapped where this faiss allows:
    ``IO_FLAG_MMAP_IFC`` (flat codes, HNSW, IVF lists, in place) then ``IO_FLAG_MMAP`` (IVF
    lists), else a plain read. Returns ``(index, how)``."""
    import faiss

    for name in ("IO_FLAG_MMAP_IFC", "IO_FLAG_MMAP"):
        flag = getattr(faiss, name, None)
        if flag is None:
            continue
        try:
            return faiss.read_index(str(path), int(flag)), name
        except RuntimeError:
            continue
    return faiss.read_index(str(path)), "read"


def to_all_gpus(index, where: Path):
    """The index copied to every visible GPU (sharded, fp16), or one line saying why not."""
    import faiss

    ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if not hasattr(faiss, "index_cpu_to_all_gpus") or ngpu == 0:
        raise R3RagError(f"{where}: --faiss-gpu, but this faiss build sees no GPU (faiss {faiss.__version__}, "
                         f"{ngpu} GPUs); install faiss-gpu on a CUDA machine or serve without --faiss-gpu")
    co = faiss.GpuMultipleClonerOptions()
    co.shard = True
    co.useFloat16 = True
    try:
        return faiss.index_cpu_to_all_gpus(index, co=co, ngpu=ngpu)
    except RuntimeError as err:
        raise R3RagError(f"{where}: copying the index to {ngpu} GPU(s) failed: {str(err).splitlines()[-1]}") from None


class DenseSearcher(RowSearcher):
    """Encode queries with the manifest's encoder settings, search the faiss index.

    ``mmap`` (default) maps the index file instead of reading it; ``faiss_gpu`` copies it to every
    GPU instead; ``refine_k`` (default: the manifest's) re-scores that many candidates exactly
    from the stored vectors; ``encoder`` (a folder or an :class:`Encoder`) replaces the manifest's
    encoder after checking that it reproduces the manifest's probe."""

    def __init__(self, index_dir: Path, manifest: Manifest, store, ef_search: int | None = None,
                 nprobe: int | None = None, device: str | None = None, batch_size: int = 64,
                 encoder: Encoder | str | None = None, mmap: bool = True, faiss_gpu: bool = False,
                 refine_k: int | None = None):
        import faiss

        super().__init__(manifest, store)
        info = manifest.dense
        assert info is not None
        self.info = info
        path = index_dir / info.index_file
        if not path.is_file():
            raise IndexError_(f"{index_dir}: {info.index_file} missing; rebuild the index")
        try:
            self.index, self.loaded_with = read_index_mapped(path) if mmap else (faiss.read_index(str(path)), "read")
        except RuntimeError as err:
            raise IndexError_(f"{path}: unreadable faiss index ({str(err).splitlines()[-1]}); rebuild it") from None
        if self.index.ntotal != len(store):
            raise IndexError_(f"{index_dir}: index holds {self.index.ntotal} vectors, corpus {len(store)}; "
                              "they do not belong together (rebuild the index from this corpus)")
        if self.index.d != info.dim:
            raise IndexError_(f"{index_dir}: index vectors are {self.index.d}-d, manifest says {info.dim}")
        self.set_params(ef_search or info.ef_search, nprobe or info.nprobe)
        self.refine_k = info.refine_k if refine_k is None else int(refine_k)
        self.vectors: VectorStore | None = None
        if self.refine_k > 0:
            if not info.vectors_dir:
                raise IndexError_(f"{index_dir}: refine_k={self.refine_k} needs the stored vectors, and this index "
                                  "has none; set refine_k=0")
            self.vectors = VectorStore(index_dir / info.vectors_dir, random_access=True)
            if len(self.vectors) != len(store):
                raise IndexError_(f"{index_dir}: {len(self.vectors)} stored vectors, corpus {len(store)}")
        if faiss_gpu:
            self.index = to_all_gpus(self.index, path)
            self.loaded_with = "gpu"
        built_with = f"{info.encoder} ({info.family}, {info.pooling} pooling)"
        if isinstance(encoder, Encoder):
            self.encoder = encoder
        else:
            self.encoder = Encoder(
                encoder or info.encoder, family=info.family, pooling=info.pooling, query_prefix=info.query_prefix,
                passage_prefix=info.passage_prefix, max_length=info.max_length, batch_size=batch_size,
                device=device, normalize=info.normalize,
            )
            self.encoder.check_probe(info.probe, str(index_dir), built_with)
        if self.encoder.dim != info.dim:
            raise IndexError_(f"{index_dir}: built with {built_with} ({info.dim}-d) but the encoder "
                              f"{self.encoder.model_name} gives {self.encoder.dim}-d vectors")

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
        q = np.ascontiguousarray(vecs, dtype=np.float32)
        depth = min(max(k, self.refine_k), self.size) if self.vectors is not None else k
        scores, rows = self.index.search(q, depth)
        if self.vectors is not None and depth > 0:
            scores, rows = exact_rerank(self.vectors, q, rows, k)
        keep = [r >= 0 for r in rows]  # approximate layouts may return fewer than k (-1 rows)
        return [r[m] for r, m in zip(rows, keep)], [s[m] for s, m in zip(scores, keep)]

    def search_rows(self, queries: list[str], k: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        return self.search_vectors(self.encoder.encode(queries, "query"), k)

    def describe(self) -> dict:
        return {**super().describe(), "factory": self.info.factory, "loaded": self.loaded_with,
                "refine_k": self.refine_k if self.vectors is not None else 0}


def exact_rerank(store: VectorStore, queries: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Re-score candidate ``rows`` (queries x depth, -1 = none) exactly against the stored
    vectors and keep the best ``k`` per query (ties keep the candidate order)."""
    safe = np.where(rows >= 0, rows, 0)
    vecs = store.gather(safe)  # (q, depth, dim)
    exact = np.einsum("qd,qrd->qr", queries, vecs)
    exact[rows < 0] = -np.inf
    order = np.argsort(-exact, axis=1, kind="stable")[:, :k]
    out_rows = np.take_along_axis(rows, order, axis=1)
    out_scores = np.take_along_axis(exact, order, axis=1).astype(np.float32)
    out_rows[~np.isfinite(out_scores)] = -1
    return out_scores, out_rows


@register_loader("dense")
def _load_dense(index_dir: Path, manifest: Manifest, store, **options) -> DenseSearcher:
    """Options: ``ef_search``, ``nprobe``, ``device``, ``batch_size``, ``encoder``, ``mmap``,
    ``faiss_gpu``, ``refine_k``; others are ignored."""
    keep = ("ef_search", "nprobe", "device", "batch_size", "encoder", "mmap", "faiss_gpu", "refine_k")
    if "dense_mmap" in options:
        options = {**options, "mmap": options["dense_mmap"]}
    return DenseSearcher(index_dir, manifest, store, **{k: v for k, v in options.items() if k in keep})

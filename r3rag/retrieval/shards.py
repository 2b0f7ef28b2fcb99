"""Encode a corpus into vector shards on disk, resumably, on one or several devices.

Layout of a vector directory (``INDEX/vectors``)::

    encode.json            what is being encoded: corpus (path, bytes, passages), encoder
                           settings, shard size, stored dtype; written first
    shard-00000.npy        rows [0, S) as an (S, dim) array (fp16 by default), a plain .npy
    shard-00000.json       the shard's record: rows, bytes, sha256, seconds, device
    ...

Shard *i* holds corpus rows ``[i*S, min((i+1)*S, N))``. The corpus is streamed: a worker seeks to
its shard's first line through the line offsets (``offsets.npy``, memory-mapped) and reads
``chunk_size`` lines at a time, so memory does not grow with the corpus. Each chunk's vectors
are written into a memory-mapped temporary file (``shard-00000.npy.tmp.<pid>``); when the shard
is complete the file is flushed, renamed into place (atomic) and only then is its record
written (also temp + rename). A shard is trusted only when its record exists and the file has
the recorded size, so a kill at any moment loses at most the shard being written: a rerun skips
every recorded shard and encodes the rest. Within a shard the chunks are fixed (``chunk_size``
rows from the shard start), so a shard encoded again gives the same vectors.

Several devices: one process per device (``spawn``), shard *i* to device ``i % W``; each writes
its own shards and records, so no file is shared between writers.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from r3rag.errors import R3RagError
from r3rag.retrieval.corpus import passage_from_json

SPEC_NAME = "encode.json"
SPEC_VERSION = 1
DTYPES = ("float16", "float32")


class VectorStoreError(R3RagError):
    """A vector directory is incomplete or does not match the corpus / encoder asked for."""


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def _sha256(path: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class EncodeSpec:
    """What a vector directory holds; two builds may share a directory only with equal specs."""

    corpus_path: str
    corpus_bytes: int
    num_passages: int
    encoder: dict  # Encoder.settings() plus "encode_dtype"
    shard_size: int
    dtype: str
    dim: int

    @property
    def num_shards(self) -> int:
        return max(1, -(-self.num_passages // self.shard_size))

    def rows(self, i: int) -> tuple[int, int]:
        return i * self.shard_size, min((i + 1) * self.shard_size, self.num_passages)

    def to_json(self) -> dict:
        return {"format_version": SPEC_VERSION, **self.__dict__}

    @classmethod
    def from_json(cls, obj: dict) -> "EncodeSpec":
        obj = dict(obj)
        obj.pop("format_version", None)
        return cls(**obj)

    def describe_difference(self, other: "EncodeSpec") -> str | None:
        """Why vectors made under ``other`` cannot be reused for ``self`` (None if they can)."""
        if (self.corpus_bytes, self.num_passages) != (other.corpus_bytes, other.num_passages):
            return (f"they were encoded from a corpus of {other.num_passages} passages ({other.corpus_bytes} bytes), "
                    f"this one has {self.num_passages} ({self.corpus_bytes} bytes)")
        for key in sorted(set(self.encoder) | set(other.encoder)):
            if key != "encoder" and self.encoder.get(key) != other.encoder.get(key):
                return f"they were encoded with {key}={other.encoder.get(key)!r}, this build asks for {self.encoder.get(key)!r}"
        if Path(self.encoder.get("encoder", "")).name != Path(other.encoder.get("encoder", "")).name:
            return f"they were encoded with {other.encoder.get('encoder')}, this build asks for {self.encoder.get('encoder')}"
        if (self.shard_size, self.dtype) != (other.shard_size, other.dtype):
            return (f"they use --shard-size {other.shard_size} and --vectors-dtype {other.dtype}, this build "
                    f"asks for {self.shard_size} and {self.dtype}")
        return None


def shard_bytes(spec: EncodeSpec, i: int) -> int:
    start, end = spec.rows(i)
    return (end - start) * spec.dim * np.dtype(spec.dtype).itemsize + 128  # .npy header


def store_bytes(spec: EncodeSpec) -> int:
    return sum(shard_bytes(spec, i) for i in range(spec.num_shards))


def done_shards(vec_dir: Path, spec: EncodeSpec) -> set[int]:
    """Shards whose record exists and whose file has the recorded size and rows."""
    done = set()
    for i in range(spec.num_shards):
        rec_path = vec_dir / f"{shard_name(i)}.json"
        npy = vec_dir / f"{shard_name(i)}.npy"
        if not rec_path.is_file() or not npy.is_file():
            continue
        try:
            rec = json.loads(rec_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if (rec.get("start"), rec.get("end")) == spec.rows(i) and rec.get("bytes") == npy.stat().st_size:
            done.add(i)
    return done


def _remove_stale_temps(vec_dir: Path) -> None:
    """Delete temporary files left by processes that are no longer running."""
    for tmp in vec_dir.glob("*.tmp.*"):
        pid = tmp.name.rsplit(".", 1)[-1]
        alive = False
        if pid.isdigit():
            try:
                os.kill(int(pid), 0)
                alive = int(pid) != os.getpid()
            except OSError:
                alive = False
        if not alive:
            tmp.unlink(missing_ok=True)


def prepare_vector_dir(vec_dir: Path, spec: EncodeSpec, fresh: bool = False) -> set[int]:
    """Create or reopen ``vec_dir`` for ``spec``; returns the shards already done."""
    vec_dir.mkdir(parents=True, exist_ok=True)
    spec_path = vec_dir / SPEC_NAME
    if spec_path.is_file() and not fresh:
        try:
            old = EncodeSpec.from_json(json.loads(spec_path.read_text(encoding="utf-8")))
        except (json.JSONDecodeError, TypeError) as err:
            raise VectorStoreError(f"{spec_path}: unreadable ({err}); rerun with --fresh") from None
        why = spec.describe_difference(old)
        if why:
            raise VectorStoreError(f"{vec_dir} holds vectors that cannot be resumed: {why}; rerun with --fresh "
                                   "to encode again, or use another --out")
    if fresh:
        for f in list(vec_dir.glob("shard-*")) + [spec_path]:
            f.unlink(missing_ok=True)
    _remove_stale_temps(vec_dir)
    write_json_atomic(spec_path, spec.to_json())
    return done_shards(vec_dir, spec)


def iter_texts(corpus: Path, offsets: np.ndarray, start: int, end: int, chunk: int) -> Iterator[list[str]]:
    """The contents of corpus rows ``[start, end)`` in lists of at most ``chunk``."""
    with corpus.open("rb") as f:
        f.seek(int(offsets[start]))
        row = start
        while row < end:
            n = min(chunk, end - row)
            out = []
            for j in range(n):
                raw = f.readline()
                try:
                    obj = json.loads(raw)
                except (json.JSONDecodeError, UnicodeDecodeError) as err:
                    raise R3RagError(f"{corpus}:{row + j + 1}: not valid JSON ({err})") from None
                out.append(passage_from_json(obj, f"{corpus}:{row + j + 1}").contents)
            row += n
            yield out


def write_shard(vec_dir: Path, spec: EncodeSpec, i: int, blocks: Iterator[np.ndarray], device: str,
                bar: tqdm | None = None) -> dict:
    """Write shard ``i`` from ``blocks`` (its rows in order) into a temporary file, rename it into
    place, then write its record; returns the record. Nothing is recorded unless all went well."""
    from r3rag.retrieval.resources import peak_rss_bytes

    start, end = spec.rows(i)
    t0, c0 = time.perf_counter(), time.process_time()
    final = vec_dir / f"{shard_name(i)}.npy"
    tmp = vec_dir / f"{shard_name(i)}.npy.tmp.{os.getpid()}"
    try:
        arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=spec.dtype, shape=(end - start, spec.dim))
        pos = 0
        for vecs in blocks:
            if vecs.shape[1] != spec.dim:
                raise VectorStoreError(f"got {vecs.shape[1]}-d vectors, the vector directory holds {spec.dim}-d")
            arr[pos : pos + len(vecs)] = vecs
            pos += len(vecs)
            if bar is not None:
                bar.update(len(vecs))
        if pos != end - start:
            raise VectorStoreError(f"shard {i}: got {pos} vectors for rows {start}-{end}")
        arr.flush()
        del arr
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise R3RagError(f"writing {final} failed: {err.strerror or err}; the shard was not recorded, rerun to resume") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    rec = {"start": start, "end": end, "bytes": final.stat().st_size, "sha256": _sha256(final),
           "seconds": round(time.perf_counter() - t0, 3), "cpu_seconds": round(time.process_time() - c0, 3),
           "device": device, "peak_rss_bytes": peak_rss_bytes()}
    write_json_atomic(vec_dir / f"{shard_name(i)}.json", rec)
    return rec


def encode_shard(encoder, corpus: Path, offsets: np.ndarray, vec_dir: Path, spec: EncodeSpec, i: int,
                 chunk_size: int, bar: tqdm | None = None) -> dict:
    """Encode shard ``i`` (``chunk_size`` passages at a time) with :func:`write_shard`."""
    start, end = spec.rows(i)
    blocks = (encoder.encode(texts, "passage") for texts in iter_texts(corpus, offsets, start, end, chunk_size))
    return write_shard(vec_dir, spec, i, blocks, str(getattr(encoder, "device", "?")), bar)


def copy_shards_from_faiss(index, vec_dir: Path, spec: EncodeSpec, fresh: bool = False, block: int = 65536,
                           show_progress: bool = True) -> dict:
    """Vector shards taken from an existing faiss index that can give its vectors back (Flat, e.g.
    Search-R1's ``e5_Flat.index``, memory-mapped), so a compressed layout can be built from it
    without encoding the corpus again. Resumable like :func:`encode_shards`."""
    done = prepare_vector_dir(vec_dir, spec, fresh=fresh)
    todo = [i for i in range(spec.num_shards) if i not in done]

    def blocks(a: int, b: int) -> Iterator[np.ndarray]:
        for x in range(a, b, block):
            try:
                yield index.reconstruct_n(x, min(block, b - x))
            except RuntimeError as err:
                raise R3RagError(f"this faiss index cannot give its vectors back ({str(err).splitlines()[-1]}); "
                                 "only Flat-like indexes can be converted") from None

    initial = sum(spec.rows(i)[1] - spec.rows(i)[0] for i in done)
    with tqdm(total=spec.num_passages, initial=initial, desc="copy vectors", unit="vec", disable=not show_progress) as bar:
        for i in todo:
            write_shard(vec_dir, spec, i, blocks(*spec.rows(i)), "faiss", bar)
    return {"encoded": todo, "skipped": sorted(done)}


def _encode_worker(rank: int, world: int, encoder_kwargs: dict, corpus: str, offsets_path: str, vec_dir: str,
                   spec_json: dict, todo: list[int], chunk_size: int, show_progress: bool, threads: int | None) -> None:
    """One device's share of the shards (runs in its own process)."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    from r3rag.retrieval.encoders import Encoder

    spec = EncodeSpec.from_json(spec_json)
    enc = Encoder(**encoder_kwargs)
    offsets = np.load(offsets_path, mmap_mode="r")
    mine = [i for i in todo if i % world == rank]
    total = sum(spec.rows(i)[1] - spec.rows(i)[0] for i in mine)
    with tqdm(total=total, desc=f"encode {encoder_kwargs.get('device')}", unit="psg", position=rank,
              disable=not show_progress) as bar:
        for i in mine:
            encode_shard(enc, Path(corpus), offsets, Path(vec_dir), spec, i, chunk_size, bar)


def encode_shards(
    corpus: Path,
    offsets_path: Path,
    vec_dir: Path,
    spec: EncodeSpec,
    encoder=None,
    encoder_kwargs: dict | None = None,
    devices: list[str] | None = None,
    chunk_size: int = 4096,
    fresh: bool = False,
    show_progress: bool = True,
    on_shard_done: Callable[[int, dict], None] | None = None,
    threads: int | None = None,
) -> dict:
    """Encode every shard of ``spec`` not yet on disk. With one device (or none) the given
    ``encoder`` runs in this process; with several, one spawned process per device builds its own
    encoder from ``encoder_kwargs``. Returns ``{"encoded": [...], "skipped": [...]}``."""
    done = prepare_vector_dir(vec_dir, spec, fresh=fresh)
    todo = [i for i in range(spec.num_shards) if i not in done]
    report = {"encoded": todo, "skipped": sorted(done)}
    if not todo:
        return report
    devices = devices or []
    if len(devices) <= 1:
        if encoder is None:
            from r3rag.retrieval.encoders import Encoder

            encoder = Encoder(**{**(encoder_kwargs or {}), **({"device": devices[0]} if devices else {})})
        offsets = np.load(offsets_path, mmap_mode="r")
        total = spec.num_passages
        initial = sum(spec.rows(i)[1] - spec.rows(i)[0] for i in done)
        with tqdm(total=total, initial=initial, desc="encode", unit="psg", disable=not show_progress) as bar:
            for i in todo:
                rec = encode_shard(encoder, corpus, offsets, vec_dir, spec, i, chunk_size, bar)
                if on_shard_done is not None:
                    on_shard_done(i, rec)
        return report
    if encoder_kwargs is None:
        raise ValueError("several devices need encoder_kwargs to build one encoder per process")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_encode_worker, name=f"encode-{dev}",
                         args=(rank, len(devices), {**encoder_kwargs, "device": dev}, str(corpus), str(offsets_path),
                               str(vec_dir), spec.to_json(), todo, chunk_size, show_progress, threads))
             for rank, dev in enumerate(devices)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join()
    except BaseException:
        for p in procs:
            if p.is_alive():
                p.terminate()
        raise
    failed = [f"{p.name} (exit {p.exitcode})" for p in procs if p.exitcode != 0]
    missing = [i for i in todo if i not in done_shards(vec_dir, spec)]
    if failed or missing:
        raise R3RagError(f"encoding failed on {', '.join(failed) or 'no process'}; {len(missing)} shard(s) missing "
                         f"in {vec_dir}; rerun the same command to resume (finished shards are kept)")
    return report


def _advise_random(arr: np.ndarray) -> None:
    """Tell the kernel a memory-mapped shard is read at random rows: without it every page fault
    reads ahead 128 KB, so re-scoring 100 rows of a cold 32 GB file would read ~13 MB a query."""
    import mmap

    mm = getattr(arr, "_mmap", None)
    if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_RANDOM"):
        try:
            mm.madvise(mmap.MADV_RANDOM)
        except OSError:
            pass


class VectorStore:
    """Read-only view of a complete vector directory: memory-mapped shards, gathered by row."""

    def __init__(self, vec_dir: str | Path, random_access: bool = False) -> None:
        """``random_access``: the shards will be read a few rows at a time (serving), so the
        kernel is told not to read ahead; leave it off for sequential builds."""
        self.dir = Path(vec_dir)
        spec_path = self.dir / SPEC_NAME
        if not spec_path.is_file():
            raise VectorStoreError(f"{self.dir}: no {SPEC_NAME}; encode the corpus first (tool/build_index.py --stage encode)")
        self.spec = EncodeSpec.from_json(json.loads(spec_path.read_text(encoding="utf-8")))
        done = done_shards(self.dir, self.spec)
        missing = [i for i in range(self.spec.num_shards) if i not in done]
        if missing:
            raise VectorStoreError(f"{self.dir}: {len(missing)} of {self.spec.num_shards} shards missing or incomplete "
                                   f"(first: {shard_name(missing[0])}); rerun the encode to finish them")
        self.shards = [np.load(self.dir / f"{shard_name(i)}.npy", mmap_mode="r") for i in range(self.spec.num_shards)]
        if random_access:
            for shard in self.shards:
                _advise_random(shard)
        self.starts = np.asarray([self.spec.rows(i)[0] for i in range(self.spec.num_shards)], dtype=np.int64)

    def __len__(self) -> int:
        return self.spec.num_passages

    @property
    def dim(self) -> int:
        return self.spec.dim

    def iter_blocks(self, rows: int = 65536) -> Iterator[tuple[int, np.ndarray]]:
        """``(first_row, float32 block)`` over the whole store, shard by shard."""
        for start, shard in zip(self.starts, self.shards):
            for a in range(0, len(shard), rows):
                yield int(start) + a, np.ascontiguousarray(shard[a : a + rows], dtype=np.float32)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """float32 vectors of ``rows`` (any order, any shape (..., ) of row numbers)."""
        rows = np.asarray(rows, dtype=np.int64)
        flat = rows.reshape(-1)
        out = np.empty((len(flat), self.dim), dtype=np.float32)
        which = np.searchsorted(self.starts, flat, side="right") - 1
        for s in np.unique(which):
            sel = np.flatnonzero(which == s)
            local = flat[sel] - self.starts[s]
            order = np.argsort(local, kind="stable")  # sorted reads touch the file in order
            out[sel[order]] = self.shards[s][local[order]]
        return out.reshape(*rows.shape, self.dim)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` rows drawn uniformly without replacement (all of them if fewer), float32."""
        if n >= len(self):
            return np.concatenate([b for _, b in self.iter_blocks()])
        rows = np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))
        return self.gather(rows)

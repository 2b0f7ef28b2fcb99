"""Turn downloaded files into the files r3rag reads, never leaving a half-written one.

Every output is written to ``FILE.<pid>.tmp`` while its sha256 is computed, flushed to disk and
renamed over ``FILE`` only when complete (:class:`AtomicOutput`); a failure (bad record, full
disk, a kill) leaves at most the temp file, which no reader and no rerun trusts.

- ``questions``: a FlashRAG dataset file (``{"id", "question", "golden_answers", "metadata"}``)
  validated record by record (:func:`r3rag.data.readers.read_questions`; a bad line fails naming
  ``file:line``) and written in r3rag's question JSONL with ``metadata.dataset`` set;
- ``gunzip``: a gzipped corpus unpacked as it streams, its lines counted;
- ``concat``: files joined byte for byte (Search-R1's ``part_aa`` + ``part_ab``);
- ``sample``: ``n`` questions drawn without replacement with ``random.Random(seed)``, kept in
  file order;
- ``mix``: several question files shuffled together (seeded), ids prefixed with their set so
  they stay unique, so that the first N of the file (``data.limit``) is a mix of all sets.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import random
import zlib
from pathlib import Path
from typing import Iterable, Iterator

from r3rag.data.fetch.hub import FetchError
from r3rag.data.readers import read_questions, record_kind
from r3rag.data.records import Question
from r3rag.errors import DataError

BLOCK = 8 << 20


class AtomicOutput:
    """``with AtomicOutput(path) as out: out.write(b"...")``; ``out.sha256``/``out.size`` after."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        self._h = hashlib.sha256()
        self.size = 0
        self.sha256 = ""

    def __enter__(self) -> "AtomicOutput":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.tmp.open("wb")
        return self

    def write(self, data: bytes) -> None:
        self._fh.write(data)
        self._h.update(data)
        self.size += len(data)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            if exc is None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._fh.close()
        except OSError as err:
            exc = exc or err
        if exc is not None:
            self.tmp.unlink(missing_ok=True)
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                raise FetchError(f"{self.path}: out of disk space after {self.size / 1e9:.2f} GB "
                                 f"(nothing kept); free space or use --out on a larger disk") from None
            if exc_type is None:
                raise exc
            return
        self.sha256 = self._h.hexdigest()
        self.tmp.replace(self.path)


def _jsonl(rows: Iterable[dict]) -> Iterator[bytes]:
    for row in rows:
        yield (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")


def _write_rows(dest: Path, rows: Iterable[dict]) -> tuple[str, int]:
    n = 0
    with AtomicOutput(dest) as out:
        for line in _jsonl(rows):
            out.write(line)
            n += 1
    return out.sha256, n


def _read(path: Path) -> list[Question]:
    try:
        return read_questions(path)
    except DataError as err:
        raise FetchError(f"{err} (is it a FlashRAG dataset file?)") from None


def convert_questions(raw: Path, dest: Path, dataset: str) -> tuple[str, int]:
    """FlashRAG question file -> r3rag question JSONL; returns (sha256, rows)."""
    def rows() -> Iterator[dict]:
        for q in _read(raw):
            yield {**q.to_dict(), "metadata": {**q.metadata, "dataset": dataset}}

    return _write_rows(dest, rows())


def _bar(total: int, desc: str, progress: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=desc, disable=not progress or total < (64 << 20))


def gunzip(raw: Path, dest: Path, progress: bool = False) -> tuple[str, int]:
    """Unpack a gzipped corpus JSONL; checks the first record is a passage; returns (sha256, lines).
    The progress bar counts compressed bytes read."""
    lines = 0
    first = True
    try:
        with gzip.open(raw, "rb") as src, AtomicOutput(dest) as out, \
                _bar(raw.stat().st_size, f"unpack {raw.name}", progress) as bar:
            tail = b""
            while block := src.read(BLOCK):
                bar.update(src.fileobj.tell() - bar.n)
                if first:
                    head = block.split(b"\n", 1)[0]
                    try:
                        kind = record_kind(json.loads(head))
                    except ValueError:
                        kind = None
                    if kind != "corpus":
                        raise FetchError(f"{raw}: first line is not a corpus record {{\"id\", \"contents\"}}")
                    first = False
                lines += block.count(b"\n")
                tail = block[-1:]
                out.write(block)
            if tail and tail != b"\n":
                out.write(b"\n")
                lines += 1
    except (OSError, EOFError, zlib.error) as err:
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            raise
        raise FetchError(f"{raw}: not a complete gzip file ({err}); delete it and rerun") from None
    return out.sha256, lines


def concat(parts: list[Path], dest: Path, progress: bool = False) -> tuple[str, int]:
    """Join ``parts`` byte for byte; returns (sha256, bytes)."""
    with AtomicOutput(dest) as out, _bar(sum(p.stat().st_size for p in parts), f"join {dest.name}", progress) as bar:
        for part in parts:
            with part.open("rb") as fh:
                while block := fh.read(BLOCK):
                    out.write(block)
                    bar.update(len(block))
    return out.sha256, out.size


def sample(src: Path, dest: Path, n: int, seed: int) -> tuple[str, int]:
    """``n`` questions of ``src`` drawn with ``random.Random(seed)``, in file order."""
    qs = _read(src)
    if n > len(qs):
        raise FetchError(f"{src} has {len(qs)} questions, fewer than the {n} asked for (--rl-questions)")
    keep = sorted(random.Random(seed).sample(range(len(qs)), n))
    return _write_rows(dest, (qs[i].to_dict() for i in keep))


def mix(sources: dict[str, Path], dest: Path, seed: int) -> tuple[str, int]:
    """Every question of ``sources`` ({set: file}), ids as ``set-id``, shuffled with ``seed``."""
    rows = []
    for name, path in sources.items():
        for q in _read(path):
            rows.append({**q.to_dict(), "id": f"{name}-{q.id}"})
    random.Random(seed).shuffle(rows)
    return _write_rows(dest, rows)

"""Random access to a FlashRAG-style corpus JSONL without holding it in memory.

A corpus line is ``{"id", "contents"}`` with ``contents = "title\\ntext"`` (lines with
``title``/``text`` instead of ``contents`` are accepted). Row *i* of every index is line *i*
of the corpus. :class:`CorpusStore` memory-maps the file and an array of line offsets (8
bytes a passage, itself memory-mapped when it comes from ``offsets.npy``), parsing a line when a
search returns it. :func:`line_offsets` / :func:`write_line_offsets` find the line starts block
by block (64 MiB at a time, newline positions with numpy), so a 13 GB corpus is scanned at disk
speed in constant memory.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from r3rag.data.records import Passage
from r3rag.errors import DataError

try:  # orjson parses corpus lines about 3x faster; the standard library is the fallback
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - depends on the environment
    _loads = json.loads


def passage_from_json(obj: Any, where: str) -> Passage:
    """Turn one parsed corpus line into a :class:`Passage`; ``where`` is ``file:line``."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with 'id' and 'contents'")
    if "id" not in obj:
        raise DataError(f"{where}: missing 'id'")
    contents = obj.get("contents")
    if contents is None:
        if "text" not in obj:
            raise DataError(f"{where}: missing 'contents' (or 'title' and 'text')")
        title = obj.get("title", "")
        contents = f"{title}\n{obj['text']}" if title else str(obj["text"])
    if not isinstance(contents, str):
        raise DataError(f"{where}: 'contents' must be a string")
    return Passage(id=str(obj["id"]), contents=contents)


def iter_corpus(path: str | Path) -> Iterator[Passage]:
    """Yield the passages of a corpus JSONL in line order (blank lines are errors)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: corpus file not found")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise DataError(f"{where}: not valid JSON ({err})") from None
            yield passage_from_json(obj, where)


def require_corpus(path: str | Path) -> Path:
    """``path`` resolved, or :class:`DataError` if there is no such file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: corpus file not found")
    return path.resolve()


BLOCK_BYTES = 64 << 20


def _newline_blocks(path: str | Path, block: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """Absolute positions of the newline bytes of ``path``, one array per block read."""
    with open(path, "rb") as f:
        base = 0
        while chunk := f.read(block):
            yield np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10) + base
            base += len(chunk)


def count_lines(path: str | Path) -> int:
    """Number of lines (a last line without a newline counts)."""
    size = Path(path).stat().st_size
    n = sum(len(nl) for nl in _newline_blocks(path))
    if size and not _ends_with_newline(path):
        n += 1
    return n


def _ends_with_newline(path: str | Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


def _fill_offsets(path: str | Path, out: np.ndarray) -> None:
    size = Path(path).stat().st_size
    out[0] = 0
    pos = 1
    for nl in _newline_blocks(path):
        starts = nl + 1
        out[pos : pos + len(starts)] = starts
        pos += len(starts)
    if size and not _ends_with_newline(path):
        pos += 1
    out[pos - 1] = size
    if pos != len(out):
        raise DataError(f"{path}: changed while its lines were counted")


def line_offsets(path: str | Path) -> np.ndarray:
    """Byte offsets of every line start, plus the file size at the end (len = lines + 1)."""
    out = np.empty(count_lines(path) + 1, dtype=np.int64)
    _fill_offsets(path, out)
    return out


def write_line_offsets(path: str | Path, out: str | Path) -> np.ndarray:
    """:func:`line_offsets` written to the ``.npy`` file ``out`` without holding them in memory
    (filled through a memory map, then renamed into place); returns the file memory-mapped."""
    out = Path(out)
    tmp = out.with_name(f"{out.name}.tmp.{os.getpid()}")
    arr = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(count_lines(path) + 1,))
    try:
        _fill_offsets(path, arr)
        arr.flush()
        del arr
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return np.load(out, mmap_mode="r")


class CorpusStore:
    """Memory-mapped corpus: ``store[row] -> Passage`` and ``store.get(rows)``."""

    def __init__(self, path: str | Path, offsets: np.ndarray | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: corpus file not found")
        self.offsets = offsets if offsets is not None else line_offsets(self.path)
        self._file = self.path.open("rb")
        size = self.path.stat().st_size
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, row: int) -> Passage:
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} outside corpus of {len(self)} passages")
        raw = self._mm[int(self.offsets[row]) : int(self.offsets[row + 1])]
        return passage_from_json(json.loads(raw), f"{self.path}:{row + 1}")

    def get(self, rows: list[int], scores: list[float] | None = None) -> list[Passage]:
        """Passages of ``rows`` (in that order), with ``scores`` attached when given."""
        idx = np.asarray(rows, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"rows {rows} outside corpus of {len(self)} passages")
        starts, ends = self.offsets[idx].tolist(), self.offsets[idx + 1].tolist()
        mm, out = self._mm, []
        for j, (a, b) in enumerate(zip(starts, ends)):
            obj = _loads(mm[a:b])
            contents = obj.get("contents") if isinstance(obj, dict) else None
            if isinstance(contents, str) and "id" in obj:
                p = Passage(id=str(obj["id"]), contents=contents)
            else:
                p = passage_from_json(obj, f"{self.path}:{int(idx[j]) + 1}")
            if scores is not None:
                p.score = float(scores[j])
            out.append(p)
        return out

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            self._mm.close()
        self._file.close()

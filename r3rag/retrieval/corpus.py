"""Random access to a FlashRAG-style corpus JSONL without holding it in memory.

A corpus line is ``{"id", "contents"}`` with ``contents = "title\\ntext"`` (lines with
``title``/``text`` instead of ``contents`` are accepted). Row *i* of every index is line *i*
of the corpus. :class:`CorpusStore` memory-maps the file and keeps only an array of line
offsets (8 bytes a passage), parsing a line when a search returns it.
"""

from __future__ import annotations

import json
import mmap
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


def line_offsets(path: str | Path) -> np.ndarray:
    """Byte offsets of every line start, plus the file size at the end (len = lines + 1)."""
    offsets = [0]
    with open(path, "rb") as f:
        for raw in f:
            offsets.append(offsets[-1] + len(raw))
    return np.asarray(offsets, dtype=np.int64)


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

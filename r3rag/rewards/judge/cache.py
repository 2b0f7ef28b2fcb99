"""An on-disk cache of judge replies, keyed by the sha256 of the full request body.

The key covers everything the judge sees (model, messages, sampling settings), so changing the
prompt template, the model or the temperature never returns a stale reply. Only replies that
parsed are stored: a garbage reply is asked again next time. SQLite in WAL mode: safe for one
process with many coroutines, survives crashes, and lookups are microseconds.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any


def request_key(body: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a request body.

    >>> request_key({"b": 1, "a": [2]}) == request_key({"a": [2], "b": 1})
    True
    """
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgeCache:
    """``get(key) -> reply | None`` and ``put(key, reply)`` over a SQLite file (``":memory:"`` works)."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        if self.path != ":memory:":
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across app crashes, no fsync per reply
        self._db.execute("CREATE TABLE IF NOT EXISTS replies (key TEXT PRIMARY KEY, reply TEXT NOT NULL)")
        self._db.commit()

    def get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT reply FROM replies WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def put(self, key: str, reply: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO replies (key, reply) VALUES (?, ?)", (key, reply))
            self._db.commit()

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()

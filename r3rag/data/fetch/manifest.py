"""``fetch_manifest.json``: what every fetched file must hash to, so a rerun trusts only good files.

One JSON object under ``--out``: ``files`` maps a path (relative to ``--out``) to ``{"sha256",
"size", "from", ...}``; ``from`` names the repository, commit and path (or the items) it was made
from, ``rows`` the records of a JSONL output. It is rewritten atomically (temp file + rename)
after every finished file, so a killed fetch leaves it naming only complete files. A file that no
longer matches its entry is *corrupt*: :func:`check` names it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from r3rag.data.fetch.hub import file_sha256

MANIFEST = "fetch_manifest.json"
VERSION = 1


class Manifest:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.path = root / MANIFEST
        self.files: dict[str, dict[str, Any]] = {}
        if self.path.is_file():
            data = json.loads(self.path.read_text(encoding="utf-8"))
            self.files = dict(data.get("files", {}))

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def entry(self, path: Path) -> dict[str, Any] | None:
        return self.files.get(self.rel(path))

    def record(self, path: Path, sha256: str, **info: Any) -> None:
        self.files[self.rel(path)] = {"sha256": sha256, "size": path.stat().st_size, **info}
        self.save()

    def forget(self, path: Path) -> None:
        if self.files.pop(self.rel(path), None) is not None:
            self.save()

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"version": VERSION, "files": dict(sorted(self.files.items()))}, indent=1) + "\n",
                       encoding="utf-8")
        tmp.replace(self.path)

    def check(self, path: Path, progress: bool = False) -> str | None:
        """Why ``path`` cannot be trusted (missing, not in the manifest, wrong size or sha256), or
        None when it matches its entry."""
        entry = self.entry(path)
        if not path.is_file():
            return "missing"
        if entry is None:
            return "not in the manifest (an interrupted fetch, or written by something else)"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"corrupt: {size} bytes, the manifest says {entry['size']}"
        digest = file_sha256(path, progress=progress)
        if digest != entry["sha256"]:
            return f"corrupt: sha256 {digest[:12]}..., the manifest says {entry['sha256'][:12]}..."
        return None

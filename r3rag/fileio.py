"""Small file helpers shared by every layer (the pipeline, the SFT launcher): nothing here imports r3rag.

``atomic_write_json`` writes to a temporary file in the same folder, fsyncs it, renames it over the
target and syncs the folder, so a reader (or a rerun after a kill) sees the old file or the whole
new one, never half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def atomic_write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` so that a reader sees the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write(json.dumps(obj, indent=2, ensure_ascii=False, default=str) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    try:  # the rename itself survives a power cut only once the folder is synced
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass

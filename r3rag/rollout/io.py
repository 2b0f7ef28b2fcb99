"""Trajectories as JSONL: one ``Trajectory.to_dict()`` per line, flushed as each one finishes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Iterator

from r3rag.rollout.trajectory import Trajectory


class JsonlWriter:
    """Append trajectories to a JSONL file, one flushed line each (safe to read while it grows)."""

    def __init__(self, path: str | Path, append: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = self.path.open("a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, traj: Trajectory) -> None:
        self._fh.write(json.dumps(traj.to_dict(), ensure_ascii=False) + "\n")
        self._fh.flush()
        self.count += 1

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonlWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trajectories(path: str | Path) -> Iterator[Trajectory]:
    with Path(path).open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield Trajectory.from_dict(json.loads(line))

"""Resumable, shardable output of a cold-start build.

A build processes its questions in fixed *chunks* (``output.chunk_size`` questions, in input
order, after sharding). All results of a chunk are appended to the part files of this shard at
once, then one line is appended to ``state/part-I-of-N.jsonl`` recording the chunk index and the
byte size of every part file after it. On start the store reads the last state line, truncates
every part file back to those sizes (a SIGKILL in the middle of writing a chunk leaves a partial
chunk, which is discarded and recomputed) and resumes at the next chunk. Chunks are deterministic
(same questions, same seeds), so a resumed build is byte-identical to an uninterrupted one:
nothing lost, nothing doubled.

Layout (``NAME/part-IIIII-of-NNNNN.jsonl`` per shard, so LLaMA-Factory reads a whole folder)::

    OUT/config.yaml  dataset_info.json  summary.json
    OUT/trajectories/  sharegpt/  alpaca_steps/  decisions/  state/
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PARTS = ("trajectories", "sharegpt", "alpaca_steps", "decisions")


class ChunkStore:
    def __init__(self, out: str | Path, shard_index: int = 0, num_shards: int = 1) -> None:
        self.out = Path(out)
        self.part = f"part-{shard_index:05d}-of-{num_shards:05d}.jsonl"
        for name in (*PARTS, "state"):
            (self.out / name).mkdir(parents=True, exist_ok=True)
        self.state_path = self.out / "state" / self.part
        self.done_chunks: set[int] = set()
        self.elapsed_s = 0.0
        self._recover()

    def path(self, name: str) -> Path:
        return self.out / name / self.part

    def _recover(self) -> None:
        sizes: dict[str, int] = {name: 0 for name in PARTS}
        good = 0  # bytes of complete state lines
        if self.state_path.is_file():
            data = self.state_path.read_bytes()
            for line in data.splitlines(keepends=True):
                if not line.endswith(b"\n"):
                    break
                try:
                    rec = json.loads(line)
                except ValueError:
                    break
                self.done_chunks.add(int(rec["chunk"]))
                self.elapsed_s += float(rec.get("elapsed_s", 0.0))
                sizes = {name: int(rec["sizes"][name]) for name in PARTS}
                good += len(line)
            if good != len(data):
                with self.state_path.open("r+b") as fh:
                    fh.truncate(good)
        for name in PARTS:
            p = self.path(name)
            if not p.exists():
                p.touch()
            if p.stat().st_size != sizes[name]:
                with p.open("r+b") as fh:
                    fh.truncate(sizes[name])

    def write_chunk(self, chunk: int, rows: dict[str, list[dict[str, Any]]], elapsed_s: float) -> None:
        """Append a finished chunk's rows (per part name) and then its state line."""
        sizes: dict[str, int] = {}
        for name in PARTS:
            p = self.path(name)
            with p.open("ab") as fh:
                for row in rows.get(name, []):
                    fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            sizes[name] = p.stat().st_size
        line = json.dumps({"chunk": chunk, "sizes": sizes, "elapsed_s": round(elapsed_s, 3)}) + "\n"
        with self.state_path.open("ab") as fh:
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())
        self.done_chunks.add(chunk)
        self.elapsed_s += elapsed_s


def read_rows(out: str | Path, name: str) -> list[dict[str, Any]]:
    """All rows of one part kind, every shard, in shard order."""
    rows: list[dict[str, Any]] = []
    folder = Path(out) / name
    for p in sorted(folder.glob("part-*.jsonl")):
        with p.open(encoding="utf-8") as fh:
            rows.extend(json.loads(line) for line in fh if line.strip())
    return rows

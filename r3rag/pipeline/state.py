"""Which stages are finished: one done marker per stage, written atomically after its outputs.

``WORK/.done/<stage>.json`` holds the stage's summary (what it produced, counts, its elapsed
time) and a fingerprint of the settings it ran with. The marker is written with write-to-temp,
fsync, rename, after the stage's own outputs are complete, so after a crash or a SIGKILL either
the stage is marked done and its outputs are whole, or it is not marked and a rerun continues it
(each stage's own resume makes that cheap: finished predictions, checkpoints and kept
trajectories are reused).

The fingerprint chains: a stage's fingerprint covers its own settings and the fingerprints of
the stages it reads, so changing the cold-start settings makes the SFT and RL markers stale too.
A stale marker is an error that says which stage and how to redo it, never a silent rerun over
old outputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from r3rag.fileio import atomic_write_json

DONE_DIR = ".done"


def fingerprint(settings: Any, upstream: list[str] | tuple[str, ...] = ()) -> str:
    """A short stable hash of JSON-able ``settings`` and the upstream stages' fingerprints."""
    blob = json.dumps({"settings": settings, "upstream": list(upstream)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]


class PipelineState:
    """Done markers of the stages of one work folder."""

    def __init__(self, work: str | Path) -> None:
        self.work = Path(work)
        self.dir = self.work / DONE_DIR

    def marker_path(self, stage: str) -> Path:
        return self.dir / f"{stage}.json"

    def get(self, stage: str) -> dict[str, Any] | None:
        """The marker of ``stage`` (``None`` when it has not finished; a torn file counts as absent)."""
        path = self.marker_path(stage)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def is_done(self, stage: str, fp: str | None = None) -> bool:
        m = self.get(stage)
        return m is not None and (fp is None or m.get("fingerprint") == fp)

    def mark_done(self, stage: str, fp: str, summary: dict[str, Any], elapsed_s: float, attempts: int = 1) -> None:
        """The done marker; ``cpu`` names the machine the stage finished on (the report puts it beside
        the stage's time: the same stage takes 3x longer on an AVX2-only CPU)."""
        from r3rag.machine import cpu_name

        atomic_write_json(self.marker_path(stage), {
            "stage": stage, "fingerprint": fp, "elapsed_s": round(elapsed_s, 2), "attempts": attempts,
            "cpu": f"{cpu_name()}, {os.cpu_count()} cores", "summary": summary,
        })
        self.clock_path(stage).unlink(missing_ok=True)

    def clear(self, stage: str) -> None:
        self.marker_path(stage).unlink(missing_ok=True)
        self.clock_path(stage).unlink(missing_ok=True)

    # ---- a stage's time across invocations (a killed stage's time counts when it is resumed) ----
    def clock_path(self, stage: str) -> Path:
        return self.dir / f"{stage}.clock.json"

    def spent(self, stage: str, fp: str) -> tuple[float, int]:
        """``(seconds, attempts)`` spent on ``stage`` by earlier unfinished invocations with these settings."""
        path = self.clock_path(stage)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return 0.0, 0
        if not isinstance(data, dict) or data.get("fingerprint") != fp:
            return 0.0, 0
        return float(data.get("elapsed_s", 0.0)), int(data.get("attempts", 0))

    def record_spent(self, stage: str, fp: str, elapsed_s: float, attempts: int) -> None:
        """Note the time of an unfinished invocation so far (rewritten as it runs and when it stops)."""
        atomic_write_json(self.clock_path(stage), {"fingerprint": fp, "elapsed_s": round(elapsed_s, 2), "attempts": attempts})

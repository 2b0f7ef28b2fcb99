"""What a researcher watches: ``metrics.jsonl``, TensorBoard event files, optional W&B.

Every record has ``step`` = the number of training iterations completed when it was written
(0 for the evaluation before training) and ``kind`` (``train`` | ``eval``). Records are appended
with flush + fsync. On resume from a checkpoint taken after ``c`` iterations the file is first cut
back to the records with ``step <= c`` (the ones written after that checkpoint belong to
iterations that will run again), so no record is ever duplicated; TensorBoard is told the same
(``purge_step``).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path
from typing import Any

METRICS = "metrics.jsonl"


def read_records(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a partial last line (killed mid-write)
    return out


def truncate_records(path: str | Path, completed: int) -> int:
    """Keep records with ``step <= completed``; returns how many remain."""
    path = Path(path)
    keep = [r for r in read_records(path) if int(r.get("step", 0)) <= completed]
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    os.replace(tmp, path)
    return len(keep)


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


class MetricsLog:
    def __init__(self, out_dir: str | Path, resume_step: int, tensorboard: bool = True,
                 wandb_project: str | None = None, run_name: str = "rl", config: dict[str, Any] | None = None) -> None:
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.path = self.out / METRICS
        if self.path.exists():
            # a run with no checkpoint starts over and logs its start evaluation again: keep nothing
            truncate_records(self.path, resume_step if resume_step > 0 else -1)
        self._fh = self.path.open("a", encoding="utf-8")
        self.tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.out / "tb"), purge_step=resume_step + 1 if resume_step else None)
        self.wandb = None
        if wandb_project:
            if importlib.util.find_spec("wandb") is None:
                print("train.wandb_project is set but wandb is not installed: logging to metrics.jsonl and TensorBoard only")
            else:
                import wandb

                self.wandb = wandb.init(project=wandb_project, name=run_name, config=config, resume="allow")

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        step = int(record["step"])
        scalars = {k: float(v) for k, v in record.items() if k not in ("step",) and _finite(v)}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        self._fh.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()

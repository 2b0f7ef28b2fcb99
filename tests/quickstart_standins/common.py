"""Shared by the stand-in training programs (tests only): the CLI contract the pipeline calls.

``PROGRAM --config FILE --out DIR --set key=value ...``; ``STANDIN_SLEEP`` (seconds per unit of
work) makes a stage slow enough to be killed in the middle; ``STANDIN_BROKEN=<stage>`` makes
that stage produce unusable output. Every unit of work is appended (and fsync'ed) to a JSONL file
and skipped on a rerun, like the real programs' resume.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def parse() -> tuple[Path, dict[str, str]]:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    p.add_argument("--out")
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    sets = dict(item.split("=", 1) for item in a.set)
    out = Path(a.out or sets["output_dir"])  # train/sft.py takes its folder as a config key
    out.mkdir(parents=True, exist_ok=True)
    return out, sets


def done_lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        path.write_bytes(complete)  # a torn last line from a kill
    return [json.loads(x) for x in complete.decode().splitlines() if x.strip()]


def append(path: Path, obj: dict) -> None:
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(obj) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def pause() -> None:
    time.sleep(float(os.environ.get("STANDIN_SLEEP", "0")))


def broken(stage: str) -> bool:
    return os.environ.get("STANDIN_BROKEN") == stage


def runs_log(out: Path) -> None:
    """Count invocations (the resume test reads it)."""
    append(out / "standin_runs.jsonl", {"pid": os.getpid()})

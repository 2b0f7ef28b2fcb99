"""benchmark/perf/pick.py --quick: the batched token choice against the per-row loop it replaced,
on a real (tiny) generation: the very same tokens for every request, and timings for each row count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_gives_the_per_row_loops_tokens():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmark/perf/pick.py"), "--quick", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    gen = summary["generate"]
    assert gen["tokens"] > gen["requests"]  # the requests generated more than one token each on average
    assert gen["identical"] == gen["requests"] == 8
    assert {(p["rows"], p["temperature"]) for p in summary["pick"]} == {(4, 1.0), (4, 0.0), (16, 1.0), (16, 0.0)}
    assert all(p["per_row_ms"] > 0 and p["batched_ms"] > 0 for p in summary["pick"])

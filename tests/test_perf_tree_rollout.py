"""benchmark/perf/tree_rollout.py --quick: one real training iteration per layout on the same
questions (tiny model), and a summary whose ratios are the tree's figures over flat sampling's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_trains_both_layouts_and_reports_ratios():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmark/perf/tree_rollout.py"), "--quick", "--threads", "1"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    flat, tree = summary["per_layout"]["flat"], summary["per_layout"]["tree"]
    assert flat["chains_per_iteration"] == 8 * 4  # 8 questions x n_samples 4
    assert tree["chains_per_iteration"] >= 8 * 2  # at least the 2 roots of every question
    assert flat["tokens_per_iteration"] > 0 and tree["tokens_per_iteration"] > 0
    ratio = summary["ratio_vs_baseline"]["tree"]
    assert ratio["tokens_per_iteration"] == round(tree["tokens_per_iteration"] / flat["tokens_per_iteration"], 3)
    assert [r["iteration"] for r in summary["rows"]["tree"]] == [0]

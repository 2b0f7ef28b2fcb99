"""SIGKILL an evaluation run mid-way, rerun it: same results file as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from r3rag.config import load_config
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.datasets import ensure_world
from r3rag.evaluation.predictions import load_rows
from r3rag.evaluation.runner import run_evaluation
from r3rag.testing.tiny_models import save_tiny_model

N = 8


@pytest.mark.slow
def test_sigkill_then_rerun_equals_uninterrupted(tmp_path, repo_root):
    world = ensure_world(tmp_path / "world")
    model = save_tiny_model(tmp_path / "tiny")
    # batch size 1: no padding, so greedy outputs cannot depend on which questions share a batch
    sets = [f"dataset.world_dir={world}", f"dataset.limit={N}", "run.batch_size=1", "run.bootstrap=100",
            "rollout.max_turn_tokens=64"]
    cli = [sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "run", "--method", "r3rag_steps",
           "--model", str(model), "--no-progress"] + [a for s in sets for a in ("--set", s)]
    killed = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo_root)}
    proc = subprocess.Popen(cli + ["--out", str(killed)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    preds = killed / "predictions.jsonl"
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if preds.is_file() and preds.read_bytes().count(b"\n") >= 3:
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.005)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done_before = len(load_rows(preds, repair=False))
    assert 3 <= done_before < N
    assert not (killed / "results.json").exists()

    cfg = load_config(EvaluationConfig, None, sets + ["method.name=r3rag_steps", f"model.path={model}", "run.progress=false"])
    resumed = run_evaluation(cfg, killed)
    assert (resumed.new, resumed.skipped) == (N - done_before, done_before)
    rows = load_rows(preds)
    assert len(rows) == N and len({r["id"] for r in rows}) == N  # nothing lost, nothing doubled

    reference = run_evaluation(cfg, tmp_path / "uninterrupted")
    assert reference.new == N
    assert (killed / "results.json").read_text() == (tmp_path / "uninterrupted" / "results.json").read_text()
    ref_rows = {r["id"]: r for r in load_rows(tmp_path / "uninterrupted" / "predictions.jsonl")}
    assert {r["id"]: r["trajectory"] for r in rows} == {k: r["trajectory"] for k, r in ref_rows.items()}
    assert json.loads((killed / "results.json").read_text())["n"] == N

"""train/envs/openrlhf.sh: its command line, and that a second run is a no-op (stamp file)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from openrlhf_env import require_openrlhf

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "train" / "envs" / "openrlhf.sh"


def test_help_and_bad_options():
    proc = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "openrlhf==0.11.2" in proc.stdout and "--cpu" in proc.stdout
    proc = subprocess.run(["bash", str(SCRIPT), "--bogus"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown option" in proc.stderr
    proc = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, R3RAG_OPENRLHF_MODE="tpu"))
    assert proc.returncode == 2 and "auto, cpu or gpu" in proc.stderr


def test_second_run_is_a_no_op():
    python = require_openrlhf()
    venv = python.parent.parent
    mode = next(venv.glob(".r3rag-openrlhf-*")).name.rsplit("-", 1)[-1]
    cmd = ["bash", str(SCRIPT), f"--{mode}", "--venv", str(venv)]
    # brings a stale environment (the script changed since it was built) up to date first
    assert subprocess.run(cmd, capture_output=True, text=True, timeout=1200).returncode == 0
    stamps = list(venv.glob(".r3rag-openrlhf-*"))
    before = {p: p.stat().st_mtime for p in stamps}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stderr
    assert time.perf_counter() - t0 < 30
    assert {p: p.stat().st_mtime for p in stamps} == before

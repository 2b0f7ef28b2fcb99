"""benchmark/gpu_checks.sh fails loudly: --help, a python without torch or without CUDA (its first
step), a stage that fails; and its --tiny form runs the whole script on the CPU (world -> cold
start -> SFT -> RL -> evaluation of base, SFT, RL and RL's null control) to a summary whose last
line says pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmark" / "gpu_checks.sh"


def run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHON": sys.executable, **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=e, cwd=REPO)


def last_line(res: Path) -> str:
    return (res / "summary.txt").read_text().splitlines()[-1]


def test_help_is_usage_with_an_example_and_exit_0(tmp_path):
    r = run("--help", OUT=str(tmp_path / "out"))
    assert r.returncode == 0 and r.stdout.startswith("usage: bash benchmark/gpu_checks.sh")
    assert "Examples:" in r.stdout and "--tiny" in r.stdout
    assert not (tmp_path / "out").exists() and not (REPO / "--help").exists()  # --help is not a results folder


def test_an_unknown_option_or_two_folders_is_one_line_and_exit_2(tmp_path):
    r = run("--bogus")
    assert r.returncode == 2 and r.stderr.strip() == "gpu_checks: unknown option --bogus (see --help)"
    r = run(str(tmp_path / "a"), str(tmp_path / "b"))
    assert r.returncode == 2 and "one RESULTS_DIR only" in r.stderr


def test_a_python_without_torch_fails_the_first_step(tmp_path):
    bare = shutil.which("python3", path="/usr/bin:/bin")
    if bare is None or subprocess.run([bare, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("no python without torch on this machine")
    r = run(str(tmp_path), PYTHON=bare)
    assert r.returncode == 3
    assert r.stderr.strip().splitlines() == [f"gpu_checks: fail: prerequisites: {bare} cannot import torch: not the "
                                             "project's environment (set PYTHON)"]
    assert last_line(tmp_path).startswith("fail: prerequisites:")
    assert not (tmp_path / "gpu_training.log").exists()  # nothing ran after the failed check


def test_without_a_gpu_the_first_step_fails_unless_tiny(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run(str(tmp_path))
    assert r.returncode == 3 and last_line(tmp_path).startswith("fail: prerequisites: torch ")
    assert ("CPU-only build" in r.stderr) or ("sees no GPU" in r.stderr)


def test_a_failing_stage_fails_the_script_naming_it(tmp_path):
    r = run("--tiny", str(tmp_path / "res"), "--", "--coldstart-limit", "0", timeout=180,
            GPU_TRAINING_WORK=str(tmp_path / "work"))
    assert r.returncode == 1
    line = last_line(tmp_path / "res")
    assert line.startswith("fail: gpu_training exited 1") and "stage coldstart:" in line, line
    assert r.stderr.strip().endswith(line.split(": ", 1)[1])


@pytest.mark.slow
def test_the_tiny_run_of_the_whole_script_passes(tmp_path):
    res = tmp_path / "res"
    r = run("--tiny", str(res), timeout=600, GPU_TRAINING_WORK=str(tmp_path / "work"))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = (res / "summary.txt").read_text().splitlines()
    assert lines[-1] == "pass"
    for head in ("SFT - base: ", "RL - SFT: ", "RL - null control: ", "training reward on 2 of RL's own questions",
                 "RL moved its training reward and did no harm beyond the null control: "):
        assert any(x.startswith(head) for x in lines), head
    s = json.loads((res / "summary.json").read_text())
    assert s["figures"] == lines[2:-1] and (res / "metrics.jsonl").is_file()

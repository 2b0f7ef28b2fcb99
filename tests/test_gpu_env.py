"""train/envs/gpu.sh (make gpu-env): the CUDA environment's commands, checked on a CPU by its dry run.

What matters and could silently go wrong: CUDA torch is installed before r3rag (else pip resolves
the core's torch floor to whatever the default index has), faiss-cpu is removed before faiss-gpu
(both install the module "faiss"), the pins are the pyproject extras', and a dry run runs nothing.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "train" / "envs" / "gpu.sh"


def dry(*args: str, venv: Path) -> list[list[str]]:
    proc = subprocess.run(["bash", str(SCRIPT), *args, "--dry-run", "--venv", str(venv)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [shlex.split(line[2:]) for line in proc.stdout.splitlines() if line.startswith("+ ")]


def index_of(cmds: list[list[str]], pred) -> int:
    hits = [i for i, c in enumerate(cmds) if pred(c)]
    assert hits, cmds
    return hits[0]


def test_dry_run_prints_the_commands_in_a_working_order_and_runs_none(tmp_path):
    venv = tmp_path / "venv-gpu"
    cmds = dry("--all", venv=venv)
    assert not venv.exists()  # nothing ran
    assert cmds[0][1:] == ["-m", "venv", str(venv)]
    pip = [c for c in cmds if c[1:4] == ["-m", "pip", "install"]]
    assert all(c[0] == str(venv / "bin" / "python") for c in pip)
    torch = index_of(cmds, lambda c: "torch" in c and "--index-url" in c)
    assert cmds[torch][cmds[torch].index("--index-url") + 1].startswith("https://download.pytorch.org/whl/cu")
    core = index_of(cmds, lambda c: "-e" in c)
    assert torch < core and cmds[core][cmds[core].index("-e") + 1] == f"{ROOT}[dev,demo,vllm]"
    uninstall = index_of(cmds, lambda c: c[1:4] == ["-m", "pip", "uninstall"])
    faiss = index_of(cmds, lambda c: any(a.startswith("faiss-gpu") for a in c))
    assert cmds[uninstall][-1] == "faiss-cpu" and uninstall < faiss
    flash = index_of(cmds, lambda c: any(a.startswith("flash-attn") for a in c))
    assert "--no-build-isolation" in cmds[flash] and core < flash


def test_without_extras_no_gpu_engine_is_installed(tmp_path):
    flat = " ".join(" ".join(c) for c in dry(venv=tmp_path / "v"))
    assert "torch" in flat and "vllm" not in flat and "faiss-gpu" not in flat and "flash-attn" not in flat


def test_the_script_pins_are_the_pyproject_extras(tmp_path):
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    args = [a for c in dry("--all", venv=tmp_path / "v") for a in c]
    assert extras["faiss-gpu"][0] in args and extras["flash-attn"][0] in args and extras["vllm"] == ["vllm"]


def test_bad_option_is_one_line(tmp_path):
    proc = subprocess.run(["bash", str(SCRIPT), "--cuda-13"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and proc.stderr.strip() == "gpu.sh: error: unknown option '--cuda-13' (see --help)"


def test_make_target_and_every_named_setup_script_exist():
    out = subprocess.run(["make", "-n", "gpu-env", "EXTRAS=--vllm", "DRY_RUN=1"], cwd=ROOT, capture_output=True,
                         text=True, timeout=30).stdout
    assert "bash train/envs/gpu.sh --vllm --dry-run" in out
    for text in ((ROOT / "pyproject.toml").read_text(), (ROOT / "Makefile").read_text()):
        for path in re.findall(r"train/[\w./*-]+\.sh", text):
            assert "*" not in path and (ROOT / path).is_file(), path

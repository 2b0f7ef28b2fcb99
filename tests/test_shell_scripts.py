"""Every shell entry point of the repository fails loudly and says how it is used.

Each ``*.sh`` (and ``.ci/run``) must: run under ``set -euo pipefail``; answer ``--help`` and ``-h``
with exit 0 and a usage that shows an example invoking the script itself, whatever environment
variables are set (``--help`` is never dropped and never starts anything); refuse an unknown
argument with exit 2 and one line. The launch scripts also stop, before starting anything, when a
prerequisite is missing. Every run here is made harmless whatever the script does: the
trainer's interpreter and the environments' Python point nowhere, dry-run mode is on, and the
environment folders are temporary.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: owned and checked elsewhere (its own prerequisites and summary)
ELSEWHERE = {"benchmark/gpu_checks.sh"}


def entry_points() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.sh", ".ci/run"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted(p for p in set(listed) if p not in ELSEWHERE and (ROOT / p).is_file())


SCRIPTS = entry_points()


def safe_env(tmp_path: Path, **more: str) -> dict[str, str]:
    """Nothing a script could start exists: no trainer interpreter, no Python for the
    environment builders, temporary environment folders, dry-run mode."""
    env = dict(os.environ, R3RAG_DRY_RUN="1", OPENRLHF_PYTHON=str(tmp_path / "no-openrlhf" / "python"),
               R3RAG_LLAMAFACTORY_VENV=str(tmp_path / "lf"), R3RAG_OPENRLHF_VENV=str(tmp_path / "orl"),
               R3RAG_VLLM_CPU_VENV=str(tmp_path / "vc"), VLLM=str(tmp_path / "no-vllm"))
    env.pop("R3RAG_WRAPPER", None)
    env.update(more)
    return env


def run(script: str, *args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    if script.startswith("train/envs/"):
        env = dict(env, PYTHON=str(Path(env["OPENRLHF_PYTHON"]).parent / "python3"))  # a builder can build nothing
    return subprocess.run(["bash", script, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_every_entry_point_is_found():
    assert {".ci/run", "startup/server.sh", "startup/startup_visualize.sh", "train/scripts/common.sh",
            "train/scripts/r3rag_ppo_qwen2.5-7b.sh", "train/envs/openrlhf.sh"} <= set(SCRIPTS)
    assert not ELSEWHERE & set(SCRIPTS)


@pytest.mark.parametrize("script", SCRIPTS)
def test_strict_mode_and_valid_bash(script):
    text = (ROOT / script).read_text()
    assert re.search(r"^set -euo pipefail$", text, re.M), f"{script}: no `set -euo pipefail`"
    assert subprocess.run(["bash", "-n", script], cwd=ROOT, capture_output=True).returncode == 0


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_exits_0_with_usage_and_an_example_of_itself(script, tmp_path):
    # the variables a run needs are set: --help must still win (it was dropped and the run started)
    env = safe_env(tmp_path, POLICY=str(tmp_path), DATASET=str(tmp_path / "d.jsonl"), STAGE1_DATA="x", STAGE2_DATA="y",
                   INDEX=str(tmp_path), R3RAG_DRY_RUN="0")
    for flag in ("--help", "-h"):
        proc = run(script, flag, env=env)
        out = proc.stdout
        assert proc.returncode == 0, (script, flag, proc.stderr[-500:])
        assert re.search(r"^\s*usage:", out, re.I | re.M), f"{script} {flag}: no usage line"
        example = re.search(r"^\s*examples?\b.*", out, re.I | re.M | re.S)
        assert example, f"{script} {flag}: no example"
        shown = f"source {Path(script).name}" if script == "train/scripts/common.sh" else f"bash {script}"  # sourced, not run
        assert shown in example.group(0), f"{script} {flag}: the example does not show {shown}"
        assert "ARG --" not in out and "ray" not in proc.stderr.lower()  # nothing was launched


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_unknown_argument_is_refused(script, tmp_path):
    proc = run(script, "--no-such-flag", env=safe_env(tmp_path))
    assert proc.returncode == 2, (script, proc.stdout[-300:], proc.stderr[-300:])
    assert re.search(r"unknown|unrecognized|one argument|usage|sourced", proc.stderr, re.I), (script, proc.stderr)


def test_common_sh_is_not_a_program(tmp_path):
    proc = run("train/scripts/common.sh", env=safe_env(tmp_path))
    assert proc.returncode == 2 and "sourced by the launch scripts" in proc.stderr


@pytest.mark.parametrize("script", ["train/scripts/r3rag_ppo.sh", "train/scripts/r3rag_ppo_qwen2.5-7b.sh",
                                    "train/scripts/r1searcher.sh", "train/scripts/r1searcher_llama3.1-8b.sh"])
def test_a_launch_stops_on_a_missing_prerequisite_before_starting(script, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n')
    base = safe_env(tmp_path, R3RAG_DRY_RUN="0")
    base.pop("POLICY", None)
    proc = run(script, env=base)  # no POLICY / data
    assert proc.returncode == 2 and re.search(r"error: set (POLICY|DATASET|STAGE1_DATA)", proc.stderr), proc.stderr
    full = dict(base, POLICY=str(tmp_path), DATASET=str(data), STAGE1_DATA=str(data), STAGE2_DATA=str(data))
    proc = run(script, env=full)  # everything but OpenRLHF's environment
    assert proc.returncode == 2 and "not found: run bash train/envs/openrlhf.sh" in proc.stderr, proc.stderr


def test_r1searcher_stage2_alone_needs_its_starting_model(tmp_path):
    data = tmp_path / "s2.jsonl"
    data.write_text("{}\n")
    env = safe_env(tmp_path, R3RAG_DRY_RUN="0", STAGE="2", STAGE2_DATA=str(data))
    env.pop("POLICY", None)
    env.pop("STAGE2_POLICY", None)
    proc = run("train/scripts/r1searcher.sh", env=env)
    assert proc.returncode == 2 and "set STAGE2_POLICY (or POLICY)" in proc.stderr


def test_cluster_node_needs_rays_environment(tmp_path):
    proc = run("train/scripts/cluster_node.sh", "stop", env=safe_env(tmp_path))
    assert proc.returncode == 2 and "OpenRLHF's environment" in proc.stderr


def test_an_env_builder_needs_its_python(tmp_path):
    proc = run("train/envs/llamafactory.sh", env=safe_env(tmp_path))
    assert proc.returncode == 2 and "not found (set PYTHON=" in proc.stderr
    assert not (tmp_path / "lf").exists()


def test_the_cluster_precision_is_an_explicit_choice_openrlhf_has(tmp_path):
    """OpenRLHF's DeepSpeed parameter dtype: bf16 by default, fp16 for GPUs without native bf16,
    and fp32, which OpenRLHF does not have, refused before anything starts."""
    def flags(**env: str) -> subprocess.CompletedProcess:
        return run("train/scripts/r3rag_ppo.sh", env=safe_env(tmp_path, **env))

    out = flags().stdout.splitlines()
    assert out[out.index("ARG --ds.param_dtype") + 1] == "ARG bf16"
    out = flags(PRECISION="fp16").stdout.splitlines()
    assert out[out.index("ARG --ds.param_dtype") + 1] == "ARG fp16"
    bad = flags(PRECISION="fp32")
    assert bad.returncode == 2 and "PRECISION must be bf16 or fp16" in bad.stderr

"""The quickstart through the REAL stage programs at a tiny scale: train/build_coldstart.py (the
world's oracle), train/sft.py (LLaMA-Factory in .venvs/llamafactory), train/rl.py (GRPO), then
the evaluation of base, SFT and RL and the report; a SIGKILL in the middle of SFT (LLaMA-Factory
running under train/sft.py), of RL and of the evaluation, each followed by a rerun that finishes.

Needs LLaMA-Factory's environment (``bash train/envs/llamafactory.sh``): skipped with that reason
when it is absent, a failure when ``R3RAG_REQUIRE_ENVS=1`` (CI sets it after creating the env).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LF_VENV = Path(os.environ.get("R3RAG_LLAMAFACTORY_VENV", REPO / ".venvs" / "llamafactory"))
pytestmark = pytest.mark.slow


def _need_llamafactory() -> None:
    if (LF_VENV / "bin" / "python").is_file() and (LF_VENV / ".r3rag-llamafactory-installed").is_file():
        return
    why = f"LLaMA-Factory's environment is not at {LF_VENV} (create it: bash train/envs/llamafactory.sh)"
    if os.environ.get("R3RAG_REQUIRE_ENVS") == "1":
        pytest.fail(why + "; R3RAG_REQUIRE_ENVS=1 makes this a failure")
    pytest.skip(why)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from r3rag.testing.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("qs-real") / "tiny")


def write_preset(tmp_path: Path, model: Path, rl_iterations: int = 2) -> Path:
    preset = tmp_path / "preset.yaml"
    preset.write_text(f"""
preset: tiny-real
work: {tmp_path / 'work'}
world: {{seed: 0, size: tiny, clusters: 10, questions_per_cluster: 4}}
model: {{base: {model}}}
coldstart: {{limit: 8, min_kept: 1}}
sft:
  require_loss_drop: false   # 3 steps of a random model: too few to judge
  set: [train.max_steps=3, train.logging_steps=1, train.save_steps=1, train.per_device_train_batch_size=2,
        train.gradient_accumulation_steps=1, train.precision=fp32, launch.threads=1]
rl:
  require_signal: false      # a random model scores nothing: every group is filtered
  set: [train.iterations={rl_iterations}, train.questions_per_iter=2, rollout.n_samples=2, train.max_minutes=null,
        eval.dataset.limit=2, model.threads=1, train.checkpoint_every=1, rollout.max_new_tokens=48,
        rollout.max_turn_tokens=16, train.tensorboard=false]
eval:
  limit: 4
  base_methods: [rag]
  batch_size: 1
  set: [run.progress=false, rollout.max_new_tokens=32, rollout.max_turn_tokens=16, rollout.max_steps=2,
        method.answer_max_tokens=8]
report: {{bootstrap: 200}}
""")
    return preset


def env() -> dict[str, str]:
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    return e


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains ``text`` (the test's work folder)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                out.append(int(d.name))
        except OSError:
            continue
    return out


def _run_and_kill(preset: Path, ready, what: str, timeout: float = 600) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset)], cwd=REPO, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    end = time.time() + timeout
    while time.time() < end:
        assert proc.poll() is None, f"the quickstart ended (status {proc.returncode}) before the kill point in {what}"
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the kill point in {what} never came")


def test_the_real_stages_run_resume_after_sigkill_and_feed_each_other(tmp_path, tiny_model):
    _need_llamafactory()
    preset = write_preset(tmp_path, tiny_model, rl_iterations=30)
    work = tmp_path / "work"
    done = lambda s: (work / ".done" / f"{s}.json").is_file()  # noqa: E731

    def sft_started() -> bool:  # train/sft.py wrote LLaMA-Factory's YAML and launched it
        if not (work / "sft" / "r3rag_sft.yaml").is_file():
            return False
        time.sleep(3)  # LLaMA-Factory is importing / training now
        return True

    # SIGKILL while LLaMA-Factory trains under train/sft.py: nothing of the stage may survive
    _run_and_kill(preset, sft_started, "sft")
    assert done("coldstart") and not done("sft")
    end = time.time() + 15
    while _processes_mentioning(str(work)) and time.time() < end:
        time.sleep(0.2)
    assert _processes_mentioning(str(work)) == [], "a process of the killed SFT stage is still running"

    # SIGKILL in the middle of RL (after some iterations were logged), then in the evaluation
    _run_and_kill(preset, lambda: sum(r.get("kind") == "train" for r in jsonl(work / "rl" / "metrics.jsonl")) >= 2, "rl")
    assert done("sft") and not done("rl")
    assert list((work / "rl" / "checkpoints").glob("iter_*")), "RL wrote no resume checkpoint before the kill"
    _run_and_kill(preset, lambda: len(jsonl(work / "eval" / "sft" / "predictions.jsonl")) >= 1, "eval")
    assert done("rl") and not done("eval")

    r = subprocess.run([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset)], cwd=REPO, env=env(),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("skip: done earlier") == 5  # world, index, coldstart, sft, rl

    # each stage's outputs, and that the next stage loaded them
    summary = json.loads((work / "coldstart" / "summary.json").read_text())
    assert summary["kept"] >= 1 and (work / "coldstart" / "dataset_info.json").is_file()
    sft_marker = json.loads((work / ".done" / "sft.json").read_text())["summary"]
    assert sft_marker["checkpoint"] == str((work / "sft").resolve()) and sft_marker["losses"]
    rl_cfg = (work / "rl" / "config.yaml").read_text()
    assert f"path: {(work / 'sft').resolve()}" in rl_cfg  # RL started from the SFT checkpoint
    steps = [r_["step"] for r_ in jsonl(work / "rl" / "metrics.jsonl") if r_.get("kind") == "train"]
    assert steps == list(range(1, 31)), steps  # resumed: no iteration lost or repeated
    # finished stages keep their final models and drop their resume checkpoints (GBs each at full size)
    assert not list((work / "sft").glob("checkpoint-*")) and not (work / "rl" / "checkpoints").exists()
    results = {d.name: json.loads((d / "results.json").read_text()) for d in (work / "eval").iterdir()}
    assert results["sft"]["model"] == str((work / "sft").resolve())
    assert results["rl"]["model"] == str((work / "rl" / "final").resolve())
    for name in ("base-rag", "sft", "rl"):
        ids = [x["id"] for x in jsonl(work / "eval" / name / "predictions.jsonl")]
        assert len(ids) == len(set(ids)) == 4, name
    md = (work / "report" / "quickstart.md").read_text()
    assert "| SFT | 4 |" in md and "| RL | 4 |" in md and "| RL null control | 4 |" in md
    assert "RL moved its training reward and did no harm beyond the null control:" in md
    # RL's own check ran on its own first training questions, each row scored by its reward recipe
    train_ids = {x["id"] for x in jsonl(work / "world" / "train.jsonl")}
    checked = [jsonl(p) for p in sorted((work / "rl" / "eval").glob("step_*.jsonl"))]
    assert len(checked) == 2 and [r_["id"] for r_ in checked[0]] == [r_["id"] for r_ in checked[1]]
    assert len(checked[0]) == 2 and {r_["id"] for r_ in checked[0]} <= train_ids
    assert all(isinstance(r_["reward"], float) for rows in checked for r_ in rows)
    assert "Training reward on 2 of RL's own training questions" in md
    assert (work / "report" / "rl_curves.png").is_file() and (work / "report" / "examples.html").is_file()

"""Resume after SIGKILL: a run killed mid-way and rerun with the same command ends with the same
records as an uninterrupted run: no iteration lost or repeated, metrics.jsonl not duplicated,
and the final folder is an HF model that loads with ``--model``.

Both runs are ``train/rl.py`` subprocesses on a tiny model saved to disk, the embedded world
(built into the test's folder) and its BM25 index, with a checkpoint after every iteration.
The update is never a no-op: ``reinforce`` with gamma < 1 and an entropy bonus.
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

ROOT = Path(__file__).resolve().parents[1]
ITERS = 4


def _cmd(model: Path, world: Path, out: Path) -> list[str]:
    sets = [
        f"model.path={model}", "model.compute_dtype=float32", "model.threads=1",
        "data.name=world", f"data.world_dir={world}", "data.split=train",
        "rollout.format=r3rag_steps", "rollout.n_samples=2", "rollout.max_steps=2", "rollout.max_turn_tokens=6",
        "rollout.max_new_tokens=12", "rollout.docs_per_step=1",
        "reward.recipe=r3rag", "algo.estimator=reinforce", "algo.gamma=0.9", "algo.entropy_coef=0.01", "algo.lr=1e-2",
        "algo.dynamic_filtering=false", f"train.iterations={ITERS}", "train.questions_per_iter=2",
        "train.checkpoint_every=1", "train.eval_at_start=false", "train.progress=false", "train.plots=false",
        "eval.dataset.name=world", f"eval.dataset.world_dir={world}", "eval.dataset.limit=2", "stages=[]",
    ]
    args = [sys.executable, str(ROOT / "train" / "rl.py"), "--config", str(ROOT / "configs" / "rl" / "r3rag_ppo.yaml"), "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    return args


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _train_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    steps = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if r.get("kind") == "train":
            steps.append(r["step"])
    return steps


@pytest.mark.slow
def test_sigkill_then_rerun_continues_exactly(tmp_path):
    from r3rag.testing.tiny_models import save_tiny_model
    from r3rag.world import build_world

    model = save_tiny_model(tmp_path / "tiny")
    world = tmp_path / "world"
    build_world(world, seed=0, size="small")
    ref_out, out = tmp_path / "uninterrupted", tmp_path / "killed"

    done = subprocess.run(_cmd(model, world, ref_out), env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen(_cmd(model, world, out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 600
    while time.time() < deadline and len(_train_steps(out)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)  # mid-run: after step 2's record, maybe while checkpointing
    proc.wait()
    killed_at = _train_steps(out)
    assert 2 <= len(killed_at) < ITERS and not (out / "DONE").exists()

    again = subprocess.run(_cmd(model, world, out), env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]

    # every iteration exactly once, in order; nothing duplicated
    assert _train_steps(out) == list(range(1, ITERS + 1))
    ref, got = _records(ref_out), _records(out)
    assert [r["step"] for r in got] == [r["step"] for r in ref]
    # the resumed run is the same run: same questions, same samples, same updates
    for a, b in zip(ref, got):
        for key in ("reward/total", "rollout/generated_tokens", "policy/entropy", "loss/policy", "policy/grad_norm"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert len({r["policy/entropy"] for r in ref if "policy/entropy" in r}) > 1  # the policy did change

    # the final folder is an HF model every command takes as --model
    from r3rag.rollout.backends.hf import load_model

    m, tok = load_model(str(out / "final"))
    assert m.config.vocab_size == len(tok)
    assert (out / "tb").is_dir() and any((out / "tb").iterdir())

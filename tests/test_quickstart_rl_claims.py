"""The quickstart report's learning claims on fake evaluation rows: SFT's goal is +30 EM, and RL's
checked claim is "moved its training reward and did no harm beyond the null control". Each part
of the RL claim can fail on its own, and the report's RL section states RL - SFT and RL - null
control with the replicate-aware intervals and the training reward before and after."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3rag.pipeline.config import QuickstartConfig
from r3rag.pipeline.report import write_report
from r3rag.pipeline.runner import Context
from r3rag.pipeline.state import PipelineState

REPO = Path(__file__).resolve().parents[1]
N = 60


def _rows(correct: set[int]) -> list[dict]:
    return [{"index": i, "id": f"q{i}", "question": f"question {i}?", "golden_answers": ["a"],
             "prediction": "a" if i in correct else "b", "num_retrievals": 1, "stop_reason": "answered",
             "scores": {m: float(i in correct) for m in ("em", "f1", "cover_em", "acc")},
             "metadata": {"type": "single"}, "trajectory": {"steps": []}} for i in range(N)]


def _work(tmp_path: Path, em: dict[str, int], reward_after: float) -> Context:
    """A finished work folder: eval runs with the given number of correct answers (the first ones),
    an RL marker whose reward check went from 1.0 to ``reward_after`` on 32 questions."""
    work = tmp_path / "work"
    state = PipelineState(work)
    runs = {}
    for name, k in em.items():
        d = work / "eval" / name
        d.mkdir(parents=True)
        (d / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(set(range(k)))))
        role = {"base-rag": "base", "rl-null": "rl_null"}.get(name, name)
        runs[name] = {"dir": str(d), "role": role, "model": str(d), "method": "rag" if role == "base" else "r3rag_steps"}
    state.mark_done("eval", "x", {"runs": runs}, 1.0)
    from r3rag.train.rl.evaluate import paired_reward

    before = [{"id": f"t{i}", "reward": 1.0} for i in range(32)]
    after = [{"id": f"t{i}", "reward": reward_after + (0.1 if i % 2 else -0.1)} for i in range(32)]
    state.mark_done("rl", "y", {"checkpoint": str(work / "rl" / "final"), "trajectories": 224,
                                "reward_check": paired_reward(before, after), "curves": []}, 1.0)
    cfg = QuickstartConfig(work=str(work), report={"bootstrap": 200, "examples": 0})
    return Context(cfg=cfg, work=work, repo_root=REPO, echo=lambda s: None, echo_children=False)


def _claims(ctx: Context) -> dict[str, dict]:
    return {c["name"]: c for c in write_report(ctx)["claims"]}


def test_rl_that_moved_its_reward_and_sits_level_with_its_null_control_holds(tmp_path):
    ctx = _work(tmp_path, {"base-rag": 3, "sft": 25, "rl": 24, "rl-null": 25}, reward_after=1.5)
    c = _claims(ctx)
    assert c["rl_training"]["holds"] is True
    assert c["rl_training"]["text"].startswith("RL moved its training reward and did no harm beyond the null control: yes")
    # SFT: +36.7 beats the base and meets the +30 goal
    assert c["sft_vs_base"]["holds"] is True and c["sft_vs_base"]["goal"] == 30.0 and c["sft_vs_base"]["goal_met"] is True
    md = (ctx.work / "report" / "quickstart.md").read_text()
    for needle in ("| RL null control | 60 |", "| RL - null control | 60 |", "goal +30 EM met",
                   "- Held-out EM, RL - SFT: -1.7 [", "- Held-out EM, RL - null control: -1.7 [",
                   "Training reward on 32 of RL's own training questions", "1.000 before, 1.500 after, paired +0.500 [",
                   "A held-out gain over SFT is not expected at this size and budget", "on 224 trajectories",
                   "1.5B parameters", "10^4 trajectories"):
        assert needle in md, needle
    effects = json.loads((ctx.work / "report" / "rl_effects.json").read_text())
    assert effects["rl_vs_sft"]["em"]["diff"] == pytest.approx(100 * (24 - 25) / N, abs=1e-3)
    assert effects["rl_vs_null"]["em"]["runs"] == 1 and effects["rl_vs_null"]["em"]["control_runs"] == 1
    # the per-type and evidence sections are about the models: the null control is not one of them
    assert "RL null control" not in md.split("## EM by question type")[1]


def test_rl_below_its_null_control_fails_the_claim_even_with_its_reward_up(tmp_path):
    ctx = _work(tmp_path, {"base-rag": 3, "sft": 25, "rl": 5, "rl-null": 25}, reward_after=1.5)
    c = _claims(ctx)["rl_training"]
    assert c["holds"] is False and c["vs_null"]["ci95"][1] < 0
    assert "no: RL is below the null control" in c["text"]


def test_a_reward_that_did_not_rise_fails_the_claim(tmp_path):
    c = _claims(_work(tmp_path, {"base-rag": 3, "sft": 25, "rl": 25, "rl-null": 25}, reward_after=1.0))["rl_training"]
    assert c["holds"] is False and "the reward did not rise" in c["text"]
    c = _claims(_work(tmp_path / "down", {"base-rag": 3, "sft": 25, "rl": 25, "rl-null": 25}, reward_after=0.5))
    assert c["rl_training"]["holds"] is False and "the reward fell" in c["rl_training"]["text"]


def test_sft_below_the_goal_is_said_and_rl_without_a_null_control_is_not_measured(tmp_path):
    ctx = _work(tmp_path, {"base-rag": 3, "sft": 18, "rl": 18}, reward_after=1.5)
    c = _claims(ctx)
    # +25 EM: above zero (the claim holds) but under the +30 goal
    assert c["sft_vs_base"]["holds"] is True and c["sft_vs_base"]["goal_met"] is False
    assert "goal +30 EM not met" in c["sft_vs_base"]["text"]
    assert c["rl_training"]["holds"] is None and "not measured (the null control missing)" in c["rl_training"]["text"]

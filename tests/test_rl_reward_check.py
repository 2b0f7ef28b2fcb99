"""RL's own before/after check on its training questions (``eval.questions: training``): the
questions are the first ones of the run's training order, every row carries the reward the run's
recipe gives it, and the run's report pairs that reward before and after training."""

from __future__ import annotations

import json

from r3rag.train.rl.loop import DataOrder, first_training_questions


def test_the_checked_questions_are_the_first_iterations_prompts_without_repeats():
    qs = list(range(10))
    order = DataOrder(10, seed=1)
    first = first_training_questions(order, qs, 7, per_iter=3)
    trained = order.indices(0, 3) + order.indices(1, 3) + order.indices(2, 3)
    assert first == trained[:7] and len(set(first)) == 7
    # more than the split holds: every question once (the second epoch repeats, never listed twice)
    assert sorted(first_training_questions(order, qs, 50, per_iter=3)) == qs
    # no limit: one iteration's prompts
    assert first_training_questions(order, qs, None, per_iter=3) == order.indices(0, 3)


def test_the_run_checks_its_own_training_questions_and_pairs_their_reward(tmp_path):
    from r3rag.train.rl.metrics import read_records
    from tests.rl_helpers import QUESTIONS, tiny_cfg, tiny_trainer

    cfg = tiny_cfg("group_norm", iterations=2)
    cfg = cfg.model_copy(update={
        "train": cfg.train.model_copy(update={"eval_at_start": True, "eval_at_end": True}),
        "eval": cfg.eval.model_copy(update={"questions": "training",
                                            "dataset": cfg.eval.dataset.model_copy(update={"limit": 6})})})
    t = tiny_trainer(cfg, tmp_path)
    t.run()
    before = [json.loads(x) for x in (tmp_path / "eval" / "step_000000.jsonl").read_text().splitlines()]
    after = [json.loads(x) for x in (tmp_path / "eval" / "step_000002.jsonl").read_text().splitlines()]
    trained_ids = [QUESTIONS[i].id for i in t.order.indices(0, 4) + t.order.indices(1, 4)]
    assert [r["id"] for r in before] == trained_ids[:6] == [r["id"] for r in after]
    # the reward is the run's recipe on the row's own trajectory
    from r3rag.rollout.trajectory import Trajectory
    from tests.rl_helpers import EvenTokenReward

    for r in before + after:
        assert r["reward"] == EvenTokenReward()([Trajectory.from_dict(r["trajectory"])])[0].total
    report = json.loads((tmp_path / "eval_report.json").read_text())["reward"]
    want = sum(a["reward"] - b["reward"] for a, b in zip(after, before)) / 6
    assert report["n"] == 6 and abs(report["diff"] - round(want, 4)) < 1e-4
    assert report["ci95"][0] <= report["diff"] <= report["ci95"][1]
    evals = [r for r in read_records(tmp_path / "metrics.jsonl") if "eval/reward" in r]
    assert len(evals) == 2

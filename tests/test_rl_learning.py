"""A tiny random model learns a trivially rewarded behaviour with every estimator.

The behaviour: generate tokens with even ids (reward = their fraction, on the last step). A
random policy starts near 0.4-0.5; the test asserts that the reward curve rises, through the real
loop: rollout engine with the HF backend sharing the trained model, reward, selection, batch,
estimator, clipped loss, optimizer, metrics file.
"""

from __future__ import annotations

import json

import pytest

from r3rag.train.rl.estimators import ALL_ESTIMATORS

from rl_helpers import tiny_cfg, tiny_trainer


@pytest.mark.slow
@pytest.mark.parametrize("estimator", sorted(ALL_ESTIMATORS))
def test_reward_rises(tmp_path, estimator):
    # rft: the even-token reward has no "correct" component; the best sample of each question is imitated
    cfg = tiny_cfg(estimator, iterations=8, **({"rft_correct_only": False} if estimator == "rft" else {}))
    trainer = tiny_trainer(cfg, tmp_path)
    final = trainer.run()
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/total"] for r in recs if r["kind"] == "train"]
    assert len(rewards) == 8
    assert sum(rewards[-2:]) / 2 >= sum(rewards[:2]) / 2 + 0.15, rewards
    assert all(r["policy/logprob_mismatch"] < 1e-3 for r in recs if "policy/logprob_mismatch" in r)
    assert (final / "config.json").is_file()
    if estimator == "gae":
        assert any(r.get("loss/value", 0) > 0 for r in recs)


@pytest.mark.slow
def test_kl_to_reference_as_loss_and_in_reward(tmp_path):
    # coefficient > 0 loads the frozen reference; the KL grows as the policy moves away from it
    for use_loss in (False, True):
        cfg = tiny_cfg("reinforce_baseline", iterations=4, kl_coef=0.1, kl_use_loss=use_loss, kl_estimator="k3")
        trainer = tiny_trainer(cfg, tmp_path / str(use_loss))
        trainer.run()
        recs = [json.loads(line) for line in (tmp_path / str(use_loss) / "metrics.jsonl").read_text().splitlines()]
        kls = [r["kl/mean"] for r in recs if "kl/mean" in r]
        assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 1e-4
        assert trainer.models.reference is not None
        assert ("loss/kl" in recs[-1]) == use_loss


@pytest.mark.gpu
def test_same_code_on_cuda(tmp_path):
    cfg = tiny_cfg("group_norm", iterations=3)
    cfg.model.device = "cuda"
    cfg.model.compute_dtype = "auto"  # bfloat16 on CUDA
    trainer = tiny_trainer(cfg, tmp_path)
    trainer.run()
    assert next(trainer.models.policy.parameters()).is_cuda
    recs = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3]


def test_one_pass_update_reuses_its_own_forward_for_the_old_logprobs(tmp_path, monkeypatch):
    """With one pass over the batch and no reference the trainer skips the no-grad policy pass:
    the policy runs one forward per micro-batch instead of two, and the update is the same as with
    the separate pass (ratio 1 either way: same weights)."""
    import torch

    from r3rag.train.rl.loop import RLTrainer

    params, forwards = {}, {}
    for reuse in (True, False):
        monkeypatch.setattr(RLTrainer, "old_logprobs_from_update", lambda self, r=reuse: r)
        trainer = tiny_trainer(tiny_cfg("group_norm", iterations=1), tmp_path / str(reuse))
        trainer._build()
        calls = []
        emb = trainer.models.policy.get_input_embeddings()  # every pass of the policy goes through it
        emb.register_forward_hook(lambda mod, inp, out: calls.append(torch.is_grad_enabled()))
        rec = trainer.iteration(0)
        assert rec["batch/kept"] > 0 and rec["batch/micro_batches"] >= 1
        n_mb = rec["batch/micro_batches"]
        forwards[reuse] = (calls.count(False), calls.count(True), n_mb)  # (no-grad passes incl. rollout, gradient passes)
        params[reuse] = [p.detach().clone() for p in trainer.models.policy.parameters()]
        assert rec["policy/logprob_mismatch"] < 1e-3
        assert rec["policy/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    # the same rollout (same seeds) -> the same number of generation passes; one extra no-grad
    # pass per micro-batch only without the reuse
    (gen_r, train_r, mb_r), (gen_s, train_s, mb_s) = forwards[True], forwards[False]
    assert mb_r == mb_s and train_r == train_s == mb_r
    assert gen_s - gen_r == mb_s
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params[True], params[False]))


class _CorrectIfMostlyEven:
    """A recipe-like reward with a ``correct`` component: correct when over 60% of the generated ids are even."""

    def __call__(self, trajs):
        from rl_helpers import EvenTokenReward

        out = EvenTokenReward()(trajs)
        for r in out:
            r.components["correct"] = 1.0 if r.total > 0.6 else 0.0
        return out


def test_rft_trains_only_on_each_questions_best_correct_sample(tmp_path, monkeypatch):
    """One iteration through the real loop: per question, at most ``rft_top_k`` samples, all scored
    correct; the rest counted as rejected; the update moves the weights."""
    import torch

    cfg = tiny_cfg("rft", iterations=1, rft_top_k=1)
    trainer = tiny_trainer(cfg, tmp_path, reward=_CorrectIfMostlyEven())
    trainer._build()
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    seen = {}
    import r3rag.train.rl.loop as loop

    real_select = loop.select

    def spy(trajs, rewards, **kw):
        sel = real_select(trajs, rewards, **kw)
        seen["correct"] = {t.question_id for t, r in zip(trajs, rewards) if r.components["correct"] >= 1}
        seen["kept"] = [(trajs[i].question_id, rewards[i].components["correct"]) for i in sel.keep]
        return sel

    monkeypatch.setattr(loop, "select", spy)
    rec = trainer.iteration(0)
    assert seen["correct"], "the tiny policy produced no correct sample: the test would prove nothing"
    # one kept sample per question that had a correct one, every kept sample correct
    assert sorted(q for q, _ in seen["kept"]) == sorted(seen["correct"])
    assert all(c == 1.0 for _, c in seen["kept"])
    assert rec["batch/kept"] == len(seen["correct"]) and rec["batch/trajectories"] == 16
    assert rec["batch/rejected_fraction"] == pytest.approx((16 - len(seen["correct"])) / 16)
    after = list(trainer.models.policy.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_rft_correct_only_needs_a_correct_component(tmp_path):
    from r3rag.errors import ConfigError

    trainer = tiny_trainer(tiny_cfg("rft", iterations=1), tmp_path)  # EvenTokenReward: no "correct"
    trainer._build()
    with pytest.raises(ConfigError, match="rft_correct_only"):
        trainer.iteration(0)


def test_overlong_filtering_in_the_loop_trains_on_no_cut_trajectory(tmp_path, monkeypatch):
    """One iteration through the real loop with ``algo.overlong_filtering``: no trajectory the budget
    cut off is in the batch, their share is the logged fraction, and the others are trained on. The
    tiny policy's own stops are nearly all ``max_tokens``, so sample 0 of each question is marked cut
    (``max_steps``) and the others ``answered`` before the selection."""
    import torch

    import r3rag.train.rl.loop as loop

    cfg = tiny_cfg("group_norm", iterations=1, overlong_filtering=True)
    trainer = tiny_trainer(cfg, tmp_path)
    trainer._build()
    before = [p.detach().clone() for p in trainer.models.policy.parameters()]
    real_select, seen = loop.select, {}

    def spy(trajs, rewards, **kw):
        for t in trajs:
            t.stop_reason = "max_steps" if t.sample_index == 0 else "answered"
        sel = real_select(trajs, rewards, **kw)
        seen["kept"] = [trajs[i].sample_index for i in sel.keep]
        return sel

    monkeypatch.setattr(loop, "select", spy)
    rec = trainer.iteration(0)
    assert sorted(seen["kept"]) == [1] * 4 + [2] * 4 + [3] * 4  # 4 questions x samples 1-3
    assert rec["batch/overlong_fraction"] == pytest.approx(4 / 16) and rec["batch/kept"] == 12
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.models.policy.parameters()))

"""Several optimizer steps per rollout batch (``algo.train_batch_size``, OpenRLHF's --train_batch_size).

One iteration of the tiny model: 4 questions x 4 samples = 16 trajectories. With
``train_batch_size: 8`` they are shuffled into 2 optimizer steps; the second step's rows must be
scored against the weights that sampled them (their "old" log-probs come from the no-grad pass
before any update), not against the weights the first step left.
"""

from __future__ import annotations

import pytest
import torch

from rl_helpers import tiny_cfg, tiny_trainer


def _one_iteration(tmp_path, monkeypatch, train_batch_size, reuse=None):
    from r3rag.train.rl.loop import RLTrainer

    if reuse is not None:
        monkeypatch.setattr(RLTrainer, "old_logprobs_from_update", lambda self, r=reuse: r)
    trainer = tiny_trainer(tiny_cfg("group_norm", iterations=1, train_batch_size=train_batch_size), tmp_path)
    trainer._build()
    passes = []  # torch.is_grad_enabled() of every policy forward (rollout steps included)
    trainer.models.policy.get_input_embeddings().register_forward_hook(lambda mod, inp, out: passes.append(torch.is_grad_enabled()))
    n_steps = []
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda *a, **k: (n_steps.append(1), step(*a, **k))[1])
    rec = trainer.iteration(0)
    params = [p.detach().clone() for p in trainer.models.policy.parameters()]
    return rec, params, passes, len(n_steps)


def test_one_step_per_batch_by_default(tmp_path, monkeypatch):
    rec, _, passes, n_steps = _one_iteration(tmp_path, monkeypatch, None)
    assert rec["batch/kept"] == 16
    assert n_steps == rec["batch/optimizer_steps"] == 1
    assert passes.count(True) == rec["batch/micro_batches"]  # one gradient forward per micro-batch
    assert abs(rec["policy/ppo_kl"]) == pytest.approx(0.0, abs=1e-7)  # every row scored by the weights that sampled it


def test_a_smaller_train_batch_takes_several_steps_scored_against_the_sampling_weights(tmp_path, monkeypatch):
    rec, params, passes, n_steps = _one_iteration(tmp_path / "reuse", monkeypatch, 8, reuse=True)
    assert rec["batch/kept"] == 16
    assert n_steps == rec["batch/optimizer_steps"] == 2  # 16 trajectories / 8 per step
    n_mb = rec["batch/micro_batches"]
    assert passes.count(True) == n_mb  # one gradient forward per micro-batch, both steps
    # the second step's rows see weights the first step moved: their ratio is not 1
    assert abs(rec["policy/ppo_kl"]) > 1e-6

    # the same iteration with a no-grad pass for every row before any update (no reuse at all)
    rec_s, params_s, passes_s, n_steps_s = _one_iteration(tmp_path / "separate", monkeypatch, 8, reuse=False)
    assert n_steps_s == 2 and rec_s["batch/micro_batches"] == n_mb
    # the reuse skipped the no-grad pass for the first step's micro-batches only
    skipped = passes_s.count(False) - passes.count(False)
    assert 1 <= skipped < n_mb
    # and changed nothing: the first step's own forward is on the untouched weights, the second
    # step's old log-probs were taken before the first step
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(params, params_s))
    assert rec["loss/policy"] == pytest.approx(rec_s["loss/policy"], abs=1e-6)


def test_the_split_is_seeded_by_the_iteration(tmp_path):
    from r3rag.train.rl.batch import optimizer_steps

    a, b = optimizer_steps(16, 8, seed=0), optimizer_steps(16, 8, seed=1)
    assert sorted(a[0] + a[1]) == list(range(16)) and a != b
    assert optimizer_steps(16, 16, seed=3) == [list(range(16))]


def test_two_passes_reshuffle_the_steps_and_keep_the_sampling_weights_old_logprobs(tmp_path, monkeypatch):
    """epochs_per_batch=2 with 2 steps a pass: 4 optimizer steps; the second pass uses the old
    log-probs of the first (the same parameters as a no-grad pass over every row first)."""
    from r3rag.train.rl.loop import RLTrainer

    runs = {}
    for reuse in (True, False):
        monkeypatch.setattr(RLTrainer, "old_logprobs_from_update", lambda self, r=reuse: r)
        trainer = tiny_trainer(tiny_cfg("group_norm", iterations=1, train_batch_size=8, epochs_per_batch=2), tmp_path / str(reuse))
        trainer._build()
        rec = trainer.iteration(0)
        runs[reuse] = (rec, [p.detach().clone() for p in trainer.models.policy.parameters()])
    rec = runs[True][0]
    assert rec["batch/optimizer_steps"] == 4
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(runs[True][1], runs[False][1]))

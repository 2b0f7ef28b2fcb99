"""The SFT time budget (``train.max_minutes``) and its schedule fit, driven like the HF Trainer
drives a callback, with a fake clock and a real cosine LambdaLR.

The case that motivated it: on an AVX2-only CPU, 150 scheduled steps at about 20 s each did not
fit the 25-minute cap; the run stopped at step 46 with the cosine schedule near its peak.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from transformers import get_cosine_schedule_with_warmup

from r3rag.train.sft.lf_launch import time_budget_callback


def _drive(budget_s: float, step_s: float, max_steps: int, fit: bool, first_step_s: float = 30.0):
    """Run the callback over ``max_steps`` steps of ``step_s`` seconds (the first one slower);
    returns (steps run, learning rate after each step, the callback)."""
    clock = {"t": 0.0}
    cb = time_budget_callback(budget_s, fit_schedule=fit, probe_steps=5, clock=lambda: clock["t"])
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=int(0.1 * max_steps), num_training_steps=max_steps)
    state = SimpleNamespace(global_step=0, max_steps=max_steps)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_train_begin(None, state, control)
    lrs = []
    while state.global_step < max_steps and not control.should_training_stop:
        clock["t"] += first_step_s if state.global_step == 0 else step_s
        opt.step()
        sched.step()
        state.global_step += 1
        lrs.append(sched.get_last_lr()[0])
        cb.on_step_end(None, state, control, lr_scheduler=sched, optimizer=opt)
    return state.global_step, lrs, cb


def test_a_schedule_that_does_not_fit_is_shortened_and_ends_decayed():
    # 150 steps x 20 s = 50 min > 25 min: (1500 s - 30 s - 5 x 20 s) / 20 s -> 68 more after step 6
    steps, lrs, cb = _drive(budget_s=1500, step_s=20, max_steps=150, fit=True)
    assert cb.fitted == steps == 6 + (1500 - 30 - 5 * 20) // 20 == 74
    assert max(lrs) == pytest.approx(2e-4, rel=0.05)  # the warmup still reaches the peak
    assert lrs[-1] < 0.01 * max(lrs)  # and the cosine has decayed by the last step


def test_without_the_fit_the_budget_cuts_the_schedule_near_its_peak():
    steps, lrs, cb = _drive(budget_s=1500, step_s=20, max_steps=150, fit=False)
    assert cb.fitted is None and steps == 1 + (1500 - 30) // 20 + 1 == 75  # stops once 1500 s have passed
    assert lrs[-1] > 0.5 * max(lrs)


def test_a_schedule_that_fits_is_left_alone():
    steps, lrs, cb = _drive(budget_s=1500, step_s=5, max_steps=150, fit=True)
    assert cb.fitted is None and steps == 150
    ref = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4), 15, 150)
    expected = []
    for _ in range(150):
        ref.optimizer.step()
        ref.step()
        expected.append(ref.get_last_lr()[0])
    assert lrs == pytest.approx(expected)

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


def _schedule(max_steps: int):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
    return opt, get_cosine_schedule_with_warmup(opt, num_warmup_steps=int(0.1 * max_steps), num_training_steps=max_steps)


def _drive(budget_s: float, step_s: float, max_steps: int, fit: bool, first_step_s: float = 30.0, out=None,
           start: tuple[int, dict, dict] | None = None, stop_at: int | None = None):
    """Run the callback as the HF Trainer does (on_step_begin, optimizer + scheduler step,
    global_step += 1, on_step_end) over steps of ``step_s`` seconds (the first one slower).
    ``start``: resume from (global_step, optimizer state, scheduler state) as a checkpoint
    would; ``stop_at``: a kill after that step. Returns (steps run, rate after each step, the
    callback, optimizer, scheduler)."""
    clock = {"t": 0.0}
    cb = time_budget_callback(budget_s, fit_schedule=fit, probe_steps=5, clock=lambda: clock["t"])
    opt, sched = _schedule(max_steps)
    args = SimpleNamespace(output_dir=str(out or "/nonexistent-r3rag-test"), world_size=1)
    state = SimpleNamespace(global_step=0, max_steps=max_steps)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_train_begin(args, state, control, lr_scheduler=sched, optimizer=opt)
    if start is not None:  # the Trainer loads the checkpoint after on_train_begin
        state.global_step = start[0]
        opt.load_state_dict(start[1])
        sched.load_state_dict(start[2])
    lrs = []
    first = True
    while state.global_step < max_steps and not control.should_training_stop and state.global_step != stop_at:
        cb.on_step_begin(args, state, control, lr_scheduler=sched, optimizer=opt)
        clock["t"] += first_step_s if first else step_s
        first = False
        opt.step()
        sched.step()
        state.global_step += 1
        lrs.append(sched.get_last_lr()[0])
        cb.on_step_end(args, state, control, lr_scheduler=sched, optimizer=opt)
    return state.global_step, lrs, cb, opt, sched


def test_a_schedule_that_does_not_fit_is_shortened_and_ends_decayed():
    # 150 steps x 20 s = 50 min > 25 min: (1500 s - 30 s - 5 x 20 s) / 20 s -> 68 more after step 6
    steps, lrs, cb, _, _ = _drive(budget_s=1500, step_s=20, max_steps=150, fit=True)
    assert cb.fitted == steps == 6 + (1500 - 30 - 5 * 20) // 20 == 74
    assert max(lrs) == pytest.approx(2e-4, rel=0.05)  # the warmup still reaches the peak
    assert lrs[-1] < 0.01 * max(lrs)  # and the cosine has decayed by the last step


def test_without_the_fit_the_budget_cuts_the_schedule_near_its_peak():
    steps, lrs, cb, _, _ = _drive(budget_s=1500, step_s=20, max_steps=150, fit=False)
    assert cb.fitted is None and steps == 1 + (1500 - 30) // 20 + 1 == 75  # stops once 1500 s have passed
    assert lrs[-1] > 0.5 * max(lrs)


def test_a_schedule_that_fits_is_left_alone():
    steps, lrs, cb, _, _ = _drive(budget_s=1500, step_s=5, max_steps=150, fit=True)
    assert cb.fitted is None and steps == 150
    ref = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4), 15, 150)
    expected = []
    for _ in range(150):
        ref.optimizer.step()
        ref.step()
        expected.append(ref.get_last_lr()[0])
    assert lrs == pytest.approx(expected)


def test_a_resumed_run_keeps_the_fitted_schedule(tmp_path):
    """Killed after step 30 of a run fitted to 74 steps: the checkpoint restores the scheduler's
    step count only (our stretched lambda is not saved); the resumed run re-applies the fit from
    OUTPUT_DIR/r3rag_fitted_schedule.json, and its rates continue the uninterrupted run's."""
    import json

    from r3rag.train.sft.lf_launch import FITTED

    _, whole, _, _, _ = _drive(budget_s=1500, step_s=20, max_steps=150, fit=True, out=tmp_path / "whole")
    steps, head, cb, opt, sched = _drive(budget_s=1500, step_s=20, max_steps=150, fit=True, out=tmp_path / "run", stop_at=30)
    assert steps == 30 and cb.fitted == 74
    assert json.loads((tmp_path / "run" / FITTED).read_text()) == {"from": 150, "to": 74}
    saved = (30, opt.state_dict(), sched.state_dict())
    steps, tail, cb2, _, _ = _drive(budget_s=1500, step_s=20, max_steps=150, fit=True, out=tmp_path / "run", start=saved)
    assert cb2.fitted == steps == 74
    assert head + tail == pytest.approx(whole)  # the same rates as without the kill

    # a fresh run (step 0) in a folder with an old fit ignores it and times itself
    steps, lrs, cb3, _, _ = _drive(budget_s=1500, step_s=5, max_steps=150, fit=True, out=tmp_path / "run")
    assert cb3.fitted is None and steps == 150


def test_several_processes_are_not_fitted(tmp_path, capsys):
    clock = {"t": 0.0}
    cb = time_budget_callback(1500, fit_schedule=True, probe_steps=5, clock=lambda: clock["t"])
    opt, sched = _schedule(150)
    args = SimpleNamespace(output_dir=str(tmp_path), world_size=8)
    state = SimpleNamespace(global_step=0, max_steps=150)
    control = SimpleNamespace(should_training_stop=False, should_save=False)
    cb.on_train_begin(args, state, control)
    for _ in range(6):
        clock["t"] += 20
        opt.step()
        sched.step()
        state.global_step += 1
        cb.on_step_end(args, state, control, lr_scheduler=sched)
    assert cb.fitted is None and "not fitted: it runs in several processes" in capsys.readouterr().out

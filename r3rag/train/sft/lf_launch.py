"""LLaMA-Factory's training entry with r3rag's template registered first (runs in its venv).

    python -m r3rag.train.sft.lf_launch TRAIN.yaml                 # one process (CPU, one GPU)
    torchrun --nproc_per_node 8 -m r3rag.train.sft.lf_launch TRAIN.yaml   # every rank registers it

``TRAIN.yaml`` is the LLaMA-Factory YAML that ``train/sft.py`` writes. When its ``template`` is
``r3rag``, the template is derived from ``model_name_or_path``'s tokenizer (observation role from
``R3RAG_OBSERVATION_ROLE``, default ``tool``) and registered before LLaMA-Factory's ``run_exp``. ``r3rag_max_minutes`` (our key,
removed before LLaMA-Factory sees the YAML) stops training cleanly after that much wall time. With
``r3rag_fit_schedule`` (also ours) the run first times a few steps and, when ``max_steps`` would
not fit in that time, shortens the learning-rate schedule to the steps that do, so that a capped
run ends with its schedule decayed instead of cut off near its peak rate.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    import yaml

    with open(argv[0], encoding="utf-8") as fh:
        args = yaml.safe_load(fh)
    if args.get("template") == "r3rag":
        from r3rag.train.sft.lf_template import register_r3rag_template

        register_r3rag_template(args["model_name_or_path"], observation_role=os.environ.get("R3RAG_OBSERVATION_ROLE", "tool"))
    callbacks = []
    budget = args.pop("r3rag_max_minutes", None)
    fit = bool(args.pop("r3rag_fit_schedule", False))
    if budget:
        callbacks.append(time_budget_callback(float(budget) * 60.0, fit_schedule=fit))
    from llamafactory.train.tuner import run_exp

    run_exp(args, callbacks=callbacks)
    return 0


def fitted_steps(elapsed_s: float, done: int, timed_steps: int, timed_s: float, budget_s: float, max_steps: int) -> int:
    """The steps that fit in ``budget_s``: ``done`` so far, plus the time left at the pace of the
    ``timed_steps`` most recent ones; never more than ``max_steps``, never fewer than ``done + 1``.

    >>> fitted_steps(elapsed_s=60, done=6, timed_steps=5, timed_s=50, budget_s=600, max_steps=150)
    60
    >>> fitted_steps(elapsed_s=60, done=6, timed_steps=5, timed_s=50, budget_s=6000, max_steps=150)
    150
    """
    per_step = timed_s / max(1, timed_steps)
    return max(done + 1, min(max_steps, done + int(max(0.0, budget_s - elapsed_s) // per_step)))


def stretch_schedule(lr_scheduler, old_total: int, new_total: int) -> None:  # type: ignore[no-untyped-def]
    """Make a ``LambdaLR`` schedule written for ``old_total`` steps run its whole course in
    ``new_total``: every factor is read at ``step * old_total / new_total`` (warmup included)."""
    scale = old_total / new_total
    lr_scheduler.lr_lambdas = [lambda step, f=f: f(step * scale) for f in lr_scheduler.lr_lambdas]


#: the fitted schedule of a capped run, in its output folder: a resumed run applies it again
FITTED = "r3rag_fitted_schedule.json"


def time_budget_callback(seconds: float, fit_schedule: bool = False, probe_steps: int = 5, clock=None):  # type: ignore[no-untyped-def]
    """Stop training cleanly (final save included) once ``seconds`` of training have passed.

    ``fit_schedule``: after ``probe_steps`` optimizer steps (timed from the end of the first one,
    which carries one-off start-up work) estimate how many steps fit in ``seconds``; if fewer than
    ``max_steps``, stretch the ``LambdaLR`` schedule to that many steps (:func:`stretch_schedule`),
    stop there, and write ``OUTPUT_DIR/r3rag_fitted_schedule.json``. A resumed run (a checkpoint
    restores only the scheduler's step count) reads it and stretches the schedule again at its
    first step, so the rate carries on where it was; its own time budget starts afresh. With more
    than one process the fit is skipped (each would time its own steps and could fit another
    count), and so is a scheduler without ``lr_lambdas``; both say so."""
    import json
    import time
    from pathlib import Path

    from transformers import TrainerCallback

    from r3rag.fileio import atomic_write_json

    now = clock or time.monotonic

    class TimeBudget(TrainerCallback):
        fitted: int | None = None

        def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self.t0 = now()
            self.first_step: tuple[int, float] | None = None
            self.probed = not fit_schedule
            self.checked_resume = not fit_schedule

        def on_step_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            # a resumed run: the checkpoint is loaded by now (global_step > 0) and restored only the
            # scheduler's step count; a fresh run in a folder with an old file ignores it
            if self.checked_resume:
                return control
            self.checked_resume = True
            saved = Path(args.output_dir) / FITTED
            if state.global_step == 0 or not saved.is_file():
                return control
            data = json.loads(saved.read_text(encoding="utf-8"))
            sched = kw.get("lr_scheduler")
            if data.get("from") == state.max_steps and sched is not None and hasattr(sched, "lr_lambdas"):
                stretch_schedule(sched, int(data["from"]), int(data["to"]))
                self.fitted, self.probed = int(data["to"]), True
                print(f"r3rag: resumed at step {state.global_step} with the schedule fitted to {self.fitted} steps", flush=True)
            return control

        def _fit(self, args, state, t: float, sched) -> None:  # type: ignore[no-untyped-def]
            timed = state.global_step - self.first_step[0]
            steps = fitted_steps(t - self.t0, state.global_step, timed, t - self.first_step[1], seconds, state.max_steps)
            if steps >= state.max_steps:
                return
            why = ("it runs in several processes" if getattr(args, "world_size", 1) > 1 else
                   "its scheduler has no lr_lambdas" if sched is None or not hasattr(sched, "lr_lambdas") else None)
            if why:
                print(f"r3rag: {state.max_steps} steps will not fit in {seconds / 60:g} min; the schedule is not fitted: {why}", flush=True)
                return
            print(f"r3rag: {state.max_steps} steps would not fit in {seconds / 60:g} min at "
                  f"{(t - self.first_step[1]) / timed:.1f} s/step: the schedule is fitted to {steps} steps", flush=True)
            stretch_schedule(sched, state.max_steps, steps)
            self.fitted = steps
            atomic_write_json(Path(args.output_dir) / FITTED, {"from": state.max_steps, "to": steps})  # a kill never leaves half a file

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            t = now()
            if self.first_step is None:
                self.first_step = (state.global_step, t)
            elif not self.probed and state.global_step - self.first_step[0] >= probe_steps:
                self.probed = True
                self._fit(args, state, t, kw.get("lr_scheduler"))
            if t - self.t0 >= seconds or (self.fitted is not None and state.global_step >= self.fitted):
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


if __name__ == "__main__":
    sys.exit(main())

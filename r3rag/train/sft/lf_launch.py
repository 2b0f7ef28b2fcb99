"""LLaMA-Factory's training entry with r3rag's template registered first (runs in its venv).

    python -m r3rag.train.sft.lf_launch TRAIN.yaml                 # one process (CPU, one GPU)
    torchrun --nproc_per_node 8 -m r3rag.train.sft.lf_launch TRAIN.yaml   # every rank registers it

``TRAIN.yaml`` is the LLaMA-Factory YAML that ``train/sft.py`` writes. When its ``template`` is
``r3rag``, the template is derived from ``model_name_or_path``'s tokenizer (observation role from
``R3RAG_OBSERVATION_ROLE``, default ``tool``) and registered before LLaMA-Factory's ``run_exp``. ``r3rag_max_minutes`` (our key,
removed before LLaMA-Factory sees the YAML) stops training cleanly after that much wall time.
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
    if budget:
        callbacks.append(time_budget_callback(float(budget) * 60.0))
    from llamafactory.train.tuner import run_exp

    run_exp(args, callbacks=callbacks)
    return 0


def time_budget_callback(seconds: float):  # type: ignore[no-untyped-def]
    """Stop training cleanly (final save included) once ``seconds`` of training have passed."""
    import time

    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            self.t0 = time.monotonic()

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            if time.monotonic() - self.t0 >= seconds:
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


if __name__ == "__main__":
    sys.exit(main())

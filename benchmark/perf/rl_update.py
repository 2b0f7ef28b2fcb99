"""The RL update with the whole policy trained, or only its top layers (``model.trainable_layers``).

An RL iteration on 2 CPU cores is about half generation and half update (forward and backward
over every kept trajectory, documents included as context, then AdamW). Freezing the lower
decoder layers skips their backward pass and their optimizer state. This benchmark measures
what that buys on a real rollout batch:

1. builds a trainer from the RL config and checkpoint and samples one rollout batch (the
   config's questions per iteration x samples, rewards, selection) once;
2. for each setting of ``--layers`` (``all`` = the whole model, or a number of top layers), in
   alternating order over ``--repeats``: restores the starting weights, freezes, makes a fresh
   optimizer and times the trainer's own update on that same batch (``RLTrainer._train_on``).

Every setting trains on the same rows, so the times compare like for like; the ratio
``speedup_vs_all`` is the whole model's update time over each setting's. The last line is a
one-line JSON summary.

    python benchmark/perf/rl_update.py --quick
    python benchmark/perf/rl_update.py --model WORK/sft --world-dir WORK/world --layers all,10,4 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402
from r3rag.testing.rl_bench import add_trainer_args  # noqa: E402


def parse_layers(text: str) -> list[int | None]:
    """``"all,10,4"`` -> ``[None, 10, 4]`` (None: the whole model)."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        out.append(None if part == "all" else int(part))
    return out


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trainer_args(p, ROOT)
    p.add_argument("--layers", default="all,10", help="comma-separated: all, or a number of top layers to train (default: %(default)s)")
    args = p.parse_args()

    import torch

    from r3rag.config import load_config
    from r3rag.testing.rl_bench import trainer_overrides_for
    from r3rag.train.rl.batch import build_batch, select
    from r3rag.train.rl.config import RLConfig
    from r3rag.train.rl.estimators import GROUP_ESTIMATORS
    from r3rag.train.rl.freeze import freeze_lower_layers
    from r3rag.train.rl.loop import RLTrainer

    settings = parse_layers(args.layers)
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-rlupdate-"))
    model_path, common = trainer_overrides_for(args, tmp, ROOT)
    if args.quick:  # the tiny model has 2 layers
        settings = [None if s is None else min(s, 1) for s in settings]
    overrides = [*common, *args.overrides]
    cfg = load_config(RLConfig, args.config, overrides).check()
    trainer = RLTrainer(cfg, tmp / "run")
    trainer._build()
    trainer.models.policy.eval()
    t = time.perf_counter()
    trajs = trainer._rollout(0)
    rollout_s = time.perf_counter() - t
    rewards = trainer.reward_fn(trajs)
    a = cfg.algo
    sel = select(trajs, rewards, grouped=a.estimator in GROUP_ESTIMATORS, dynamic_filtering=a.dynamic_filtering, tol=a.filter_tol)
    if not sel.keep:
        raise SystemExit("every group of the sampled batch was filtered (all samples scored the same): rerun with --set "
                         "algo.dynamic_filtering=false or more questions")
    batch = build_batch([trajs[i] for i in sel.keep], [rewards[i] for i in sel.keep], trainer._pad_id(), cfg.rollout.temperature_for)
    start = {k: v.detach().clone() for k, v in trainer.models.policy.state_dict().items()}
    print(f"rollout: {len(trajs)} trajectories in {rollout_s:.1f} s, {len(sel.keep)} kept, "
          f"{int(batch.action_mask.sum())} generated of {sum(batch.lengths)} tokens", flush=True)

    runs: dict[str, list[dict]] = {("all" if s is None else str(s)): [] for s in settings}
    for r in range(args.repeats):
        for s in (settings if r % 2 == 0 else settings[::-1]):
            name = "all" if s is None else str(s)
            policy = trainer.models.policy
            policy.load_state_dict(start)
            split = freeze_lower_layers(policy, s)
            trainer.optimizer = torch.optim.AdamW([q for q in policy.parameters() if q.requires_grad], lr=a.lr, betas=a.betas,
                                                  weight_decay=a.weight_decay)
            times: dict[str, float] = {}
            t = time.perf_counter()
            stats = trainer._train_on(batch, times, 0)
            wall = time.perf_counter() - t
            row = {"repeat": r, "update_s": round(wall, 2), "trainable_params": split.trainable_params,
                   "grad_norm": round(stats.get("policy/grad_norm", 0.0), 4)}
            runs[name].append(row)
            print(f"{name:>4} layers (repeat {r}): update {wall:.1f} s, {split.trainable_params / 1e6:.1f}M trainable parameters", flush=True)

    mean = {k: sum(x["update_s"] for x in v) / len(v) for k, v in runs.items()}
    summary = {"benchmark": "rl_update", "quick": args.quick, "model": Path(model_path).name, "threads": args.threads,
               "cpu": cpu_name(), "trajectories": len(sel.keep), "generated_tokens": int(batch.action_mask.sum()),
               "tokens": int(sum(batch.lengths)), "layers": trainer.frozen.layers,
               "mean_update_s": {k: round(v, 2) for k, v in mean.items()},
               "speedup_vs_all": {k: round(mean["all"] / v, 3) for k, v in mean.items()} if "all" in mean else {},
               "runs": runs}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

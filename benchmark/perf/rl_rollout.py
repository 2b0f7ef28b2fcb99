"""The RL rollout with the trainer's float32 model under bf16 autocast, or with a bf16 copy of it.

``train/rl.py`` generates each iteration's trajectories before it trains on them. By default
(``model.rollout_weights: shared``) the rollout runs the trainer's own float32 model inside
``torch.autocast(bfloat16)``; ``model.rollout_weights: bfloat16`` gives the rollout a bf16 copy,
reloaded from the trainer's weights at the start of every iteration. This benchmark builds one
trainer per mode from the same RL config and checkpoint and, for each:

1. times a rollout (``--questions`` prompts x ``rollout.n_samples``, the config's sampling);
2. runs one real training iteration (rollout, rewards, update: the optimizer moves the weights);
3. times another rollout with the updated weights (does generation slow down after an update?).

The modes run in alternating order over ``--repeats`` (AB, BA, ...), so drift on a noisy machine
falls on both. Sampled trajectories differ between modes (different rounding), so speed is
compared per generated token; forward passes are timed with
:class:`r3rag.evaluation.profile.ForwardTimer` to split generation into model work and the
backend's Python work. The retriever is the world's BM25 index in this process (retrieval is
under 1% of a rollout). The last line is a one-line JSON summary.

    python benchmark/perf/rl_rollout.py --quick
    python benchmark/perf/rl_rollout.py --model WORK/sft --world-dir WORK/world
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402

MODES = ("shared", "bfloat16")


def timed_rollout(trainer, it: int) -> dict:
    """Generate iteration ``it``'s trajectories with the trainer's current weights; time it."""
    from r3rag.evaluation.profile import ForwardTimer

    trainer._refresh_backend()
    trainer.models.policy.eval()
    t0 = time.perf_counter()
    with ForwardTimer(trainer.backend.model) as timer:
        trajs = trainer._rollout(it)
    wall = time.perf_counter() - t0
    tokens = sum(t.num_generated_tokens for t in trajs)
    fw = timer.summary()
    return {"wall_s": round(wall, 2), "trajectories": len(trajs), "generated_tokens": tokens,
            "tokens_per_s": round(tokens / wall, 1), "forward_s": fw["forward_s"],
            "backend_python_s": round(wall - fw["forward_s"], 2), "decode_ms_per_step": fw["decode_ms_per_step"],
            "prefill_ms_per_token": fw["prefill_ms_per_token"]}


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model and a small world (seconds)")
    p.add_argument("--config", default=str(ROOT / "configs/rl/world_sft_grpo.yaml"), help="RL config (default: %(default)s)")
    p.add_argument("--model", default="smollm2", help="policy checkpoint (default: %(default)s)")
    p.add_argument("--world-dir", default=None, help="world folder (default: a medium world under runs/)")
    p.add_argument("--questions", type=int, default=8, help="prompts per rollout (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="alternating passes over both modes (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more RL config overrides (repeatable)")
    args = p.parse_args()

    import torch

    from r3rag.config import load_config
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.train.rl.config import RLConfig
    from r3rag.train.rl.loop import RLTrainer

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-rlrollout-"))
    model_path, extra = args.model, []
    if args.quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model_path = str(save_tiny_model(tmp / "tiny"))
        extra = ["algo.dynamic_filtering=false", "rollout.max_new_tokens=48", "rollout.max_turn_tokens=16", "rollout.max_steps=2"]
    size = "small" if args.quick else "medium"
    world = ensure_world(Path(args.world_dir) if args.world_dir else (tmp / "world" if args.quick else ROOT / "runs" / "world-medium"), size=size)
    base = [f"model.path={model_path}", f"model.threads={args.threads}", f"data.world_dir={world}", f"data.world_size={size}",
            f"train.questions_per_iter={args.questions}", "train.progress=false", "train.tensorboard=false",
            "train.eval_at_start=false", "train.eval_at_end=false", *extra, *args.overrides]
    runs: dict[str, list[dict]] = {m: [] for m in MODES}
    for r in range(args.repeats):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            cfg = load_config(RLConfig, args.config, [*base, f"model.rollout_weights={mode}"]).check()
            trainer = RLTrainer(cfg, tmp / f"{mode}-{r}")
            trainer._build()
            before = timed_rollout(trainer, 1000 + r)
            t = time.perf_counter()
            rec = trainer.iteration(0)
            update = {"iteration_s": round(time.perf_counter() - t, 2), "update_s": round(rec.get("time/update", 0.0), 2),
                      "kept": rec.get("batch/kept")}
            after = timed_rollout(trainer, 2000 + r)
            row = {"repeat": r, "before_update": before, "iteration": update, "after_update": after}
            runs[mode].append(row)
            print(f"{mode:>8} (repeat {r}): before an update {before['tokens_per_s']} tok/s "
                  f"({before['generated_tokens']} tokens in {before['wall_s']} s, backend python {before['backend_python_s']} s); "
                  f"after {after['tokens_per_s']} tok/s ({after['generated_tokens']} tokens in {after['wall_s']} s); "
                  f"update {update['update_s']} s", flush=True)
            del trainer

    def mean_rate(mode: str, key: str) -> float:
        rows = [x[key] for x in runs[mode]]
        return sum(x["generated_tokens"] for x in rows) / sum(x["wall_s"] for x in rows)

    summary = {"benchmark": "rl_rollout", "quick": args.quick, "model": Path(model_path).name, "threads": args.threads,
               "questions": args.questions, "cpu": cpu_name(),
               "speedup_bf16_copy_before_update": round(mean_rate("bfloat16", "before_update") / mean_rate("shared", "before_update"), 3),
               "speedup_bf16_copy_after_update": round(mean_rate("bfloat16", "after_update") / mean_rate("shared", "after_update"), 3),
               "shared_after_over_before": round(mean_rate("shared", "after_update") / mean_rate("shared", "before_update"), 3),
               "runs": runs}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

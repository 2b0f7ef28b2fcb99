"""The RL rollout under different settings, before and after an update.

``train/rl.py`` generates each iteration's trajectories before it trains on them. Settings
compared (``--modes``, the first is the baseline of the ratios):

- ``shared``: the trainer's own float32 model under bf16 autocast, generating on the trainer's
  thread (``model.rollout_weights: shared``, ``model.rollout_inline: true``);
- ``thread``: the same, generating in a worker thread (``model.rollout_inline: false``, the older
  behaviour);
- ``bfloat16``: a bf16 copy reloaded from the trainer's weights at every iteration
  (``model.rollout_weights: bfloat16``; what the default ``auto`` picks on a CPU computing in bf16).

For each setting the benchmark builds a trainer from the same RL config and checkpoint and:

1. times a rollout (``--questions`` prompts x ``rollout.n_samples``, the config's sampling);
2. runs one real training iteration (rollout, rewards, update: the optimizer moves the weights);
3. times another rollout with the updated weights (does generation slow down after an update?).

The settings run in alternating order over ``--repeats`` (AB, BA, ...), so drift on a noisy machine
falls on both. Sampled trajectories differ between settings (different rounding), so speed is
compared per generated token; forward passes are timed with
:class:`r3rag.evaluation.profile.ForwardTimer` to split generation into model work and the
backend's Python work. The retriever is the world's BM25 index in this process (retrieval is
under 1% of a rollout). The last line is a one-line JSON summary.

    python benchmark/perf/rl_rollout.py --quick
    python benchmark/perf/rl_rollout.py --model WORK/sft --world-dir WORK/world --modes thread,shared
"""

from __future__ import annotations

import argparse
import asyncio
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

MODES = {
    "shared": ["model.rollout_weights=shared", "model.rollout_inline=true"],
    "thread": ["model.rollout_weights=shared", "model.rollout_inline=false"],
    "bfloat16": ["model.rollout_weights=bfloat16", "model.rollout_inline=true"],
}


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
    add_trainer_args(p, ROOT)
    p.add_argument("--questions", type=int, default=8, help="prompts per rollout (default: %(default)s)")
    p.add_argument("--modes", default="shared,bfloat16", help=f"comma-separated, of {', '.join(MODES)}; the first is the baseline (default: %(default)s)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        p.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")

    import torch

    from r3rag.config import load_config
    from r3rag.testing.rl_bench import trainer_overrides_for
    from r3rag.train.rl.config import RLConfig
    from r3rag.train.rl.loop import RLTrainer

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-rlrollout-"))
    model_path, common = trainer_overrides_for(args, tmp, ROOT)
    base = [*common, f"train.questions_per_iter={args.questions}", *args.overrides]
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for mode in (modes if r % 2 == 0 else modes[::-1]):
            cfg = load_config(RLConfig, args.config, [*base, *MODES[mode]]).check()
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

    first = modes[0]
    summary = {"benchmark": "rl_rollout", "quick": args.quick, "model": Path(model_path).name, "threads": args.threads,
               "questions": args.questions, "cpu": cpu_name(), "baseline": first,
               "tokens_per_s": {m: {"before_update": round(mean_rate(m, "before_update"), 1),
                                    "after_update": round(mean_rate(m, "after_update"), 1)} for m in modes},
               "update_s": {m: round(sum(x["iteration"]["update_s"] for x in runs[m]) / len(runs[m]), 2) for m in modes},
               "speedup_vs_baseline": {m: {k: round(mean_rate(m, k) / mean_rate(first, k), 3) for k in ("before_update", "after_update")}
                                       for m in modes[1:]},
               "after_over_before": {m: round(mean_rate(m, "after_update") / mean_rate(m, "before_update"), 3) for m in modes},
               "runs": runs}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

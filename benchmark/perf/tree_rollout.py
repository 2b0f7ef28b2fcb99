"""One RL iteration with step-level tree rollouts against one with flat groups, same questions.

Layouts (``--layouts``, the first is the baseline of the ratios):

- ``flat``: ``rollout.n_samples`` chains per question (the config's, 4 in the quickstart), ``group_norm``;
- ``tree``: ``rollout.tree={roots: 2, branch: 2, at_steps: [1, 2]}`` with ``tree_group_norm``.

For each layout the benchmark builds a trainer from the same RL config and checkpoint and runs
real training iterations (rollout, rewards, update) on the same ``--questions`` training questions,
then reports per iteration: chains, generated tokens (a branch's own tokens only), wall time of
generation and of the whole iteration, generated tokens per second of generation, and the
*informative comparisons* (sibling groups whose rewards are not all equal: a question for flat
groups, a branching point for a tree) per minute of iteration and per 1,000 generated tokens.
A tree pays for each branch's prefix once more (one prefill per new row) and runs its levels one
after another, so its tokens per second can fall below flat sampling's; the ratio says by how much.

Layouts run in alternating order over ``--repeats`` (AB, BA, ...), so drift on a shared machine
falls on both. The retriever is the world's BM25 index in this process. The last line is a
one-line JSON summary.

    python benchmark/perf/tree_rollout.py --quick
    python benchmark/perf/tree_rollout.py --model WORK/sft --world-dir WORK/world --world-seed 1 --repeats 2
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

LAYOUTS = {
    "flat": ["algo.estimator=group_norm"],
    "tree": ["algo.estimator=tree_group_norm", "rollout.tree={roots: 2, branch: 2, at_steps: [1, 2]}"],
}


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trainer_args(p, ROOT)
    p.add_argument("--questions", type=int, default=8, help="questions per iteration (default: %(default)s)")
    p.add_argument("--iterations", type=int, default=1, help="iterations per layout and repeat (default: %(default)s)")
    p.add_argument("--layouts", default="flat,tree", help=f"comma-separated, of {', '.join(LAYOUTS)}; the first is the baseline (default: %(default)s)")
    args = p.parse_args()
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    unknown = [x for x in layouts if x not in LAYOUTS]
    if unknown or not layouts:
        p.error(f"--layouts: unknown {unknown}; choose from {', '.join(LAYOUTS)}")

    import torch

    from r3rag.config import load_config
    from r3rag.testing.rl_bench import trainer_overrides_for
    from r3rag.train.rl.config import RLConfig
    from r3rag.train.rl.loop import RLTrainer

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-tree-"))
    model_path, common = trainer_overrides_for(args, tmp, ROOT)
    base = [*common, f"train.questions_per_iter={args.questions}", *args.overrides]
    rows: dict[str, list[dict]] = {x: [] for x in layouts}
    for r in range(args.repeats):
        for layout in (layouts if r % 2 == 0 else layouts[::-1]):
            cfg = load_config(RLConfig, args.config, [*base, *LAYOUTS[layout]]).check()
            trainer = RLTrainer(cfg, tmp / f"{layout}-{r}")
            trainer._build()
            for it in range(args.iterations):  # iteration k samples the same questions in every layout
                t = time.perf_counter()
                rec = trainer.iteration(it)
                wall = time.perf_counter() - t
                # the trainer counts both layouts' comparisons (a flat group is a one-level tree); an
                # iteration whose every group was filtered out trains nothing and logs none
                groups, info = rec.get("tree/sibling_groups", 0), rec.get("tree/informative_groups", 0)
                chains = rec.get("batch/trajectories", 0)
                tokens = rec.get("rollout/generated_tokens", 0.0) * chains  # a per-chain mean
                row = {"repeat": r, "iteration": it, "chains": chains, "generated_tokens": round(tokens),
                       "generate_s": round(rec.get("time/generate", 0.0), 2), "update_s": round(rec.get("time/update", 0.0), 2),
                       "iteration_s": round(wall, 2), "sibling_groups": groups, "informative": round(info, 2),
                       "reward": rec.get("reward/total")}
                rows[layout].append(row)
                print(f"{layout:>5} (repeat {r}, iteration {it}): {chains} chains, {row['generated_tokens']} tokens, "
                      f"generation {row['generate_s']} s, iteration {row['iteration_s']} s, "
                      f"{info:.1f} informative of {groups:.0f} sibling groups", flush=True)
            del trainer

    def total(layout: str, key: str) -> float:
        return sum(x[key] for x in rows[layout])

    per = {x: {"chains_per_iteration": round(total(x, "chains") / len(rows[x]), 1),
               "tokens_per_iteration": round(total(x, "generated_tokens") / len(rows[x]), 1),
               "iteration_s": round(total(x, "iteration_s") / len(rows[x]), 1),
               "generate_tokens_per_s": round(total(x, "generated_tokens") / max(total(x, "generate_s"), 1e-9), 1),
               "informative_per_iteration": round(total(x, "informative") / len(rows[x]), 2),
               "informative_per_minute": round(60.0 * total(x, "informative") / max(total(x, "iteration_s"), 1e-9), 2),
               "informative_per_1k_tokens": round(1000.0 * total(x, "informative") / max(total(x, "generated_tokens"), 1), 3)}
           for x in layouts}
    first = layouts[0]
    summary = {"benchmark": "tree_rollout", "quick": args.quick, "model": Path(model_path).name, "threads": args.threads,
               "questions": args.questions, "iterations": args.iterations, "repeats": args.repeats, "cpu": cpu_name(),
               "baseline": first, "per_layout": per,
               "ratio_vs_baseline": {x: {k: round(per[x][k] / per[first][k], 3) if per[first][k] else None for k in per[x]}
                                     for x in layouts[1:]},
               "rows": rows}
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

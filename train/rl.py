#!/usr/bin/env python
"""Single-machine RL (Reinforce++, GRPO, RLOO, Dr. GRPO, PPO) over multi-turn retrieval trajectories.

    python train/rl.py --config configs/rl/r3rag_ppo.yaml --out runs/rl/r3rag [--set algo.lr=1e-6 ...]

Rerunning the same command after an interruption (even SIGKILL) resumes from the last
checkpoint; rerunning a finished run with train.iterations or train.max_minutes raised continues
it from its last checkpoint. The final model lands in OUT/final (OUT/<last stage>/final for staged configs),
an HF folder usable as --model by every other command. Details: docs/rl.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.config import add_config_args  # noqa: E402
from r3rag.errors import R3RagError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, default="configs/rl/r1searcher_reinforce_baseline.yaml")
    p.add_argument("--out", required=True, help="run folder (checkpoints, metrics.jsonl, tb/, curves.png, final/)")
    p.add_argument("--device", default=None, help="shorthand for --set model.device=... (cpu | cuda)")
    p.add_argument("--model", default=None, help="shorthand for --set model.path=...")
    args = p.parse_args(argv)
    overrides = list(args.overrides)
    if args.device:
        overrides.append(f"model.device={args.device}")
    if args.model:
        overrides.append(f"model.path={args.model}")
    try:
        from r3rag.train.rl.loop import run_schedule

        final = run_schedule(args.config, overrides, args.out)
    except R3RagError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"final model: {final}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

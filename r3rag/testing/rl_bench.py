"""The RL benchmarks' shared setup (``benchmark/perf/rl_rollout.py``, ``rl_update.py``,
``tree_rollout.py``): their common flags, and the config overrides that point a trainer at a
checkpoint and a world, or, with ``quick``, at a tiny random model and a small world built on the
spot (seconds, for ``make bench``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

# a tiny random model never answers: keep its all-same groups and keep its turns short
QUICK_OVERRIDES = ["algo.dynamic_filtering=false", "rollout.max_new_tokens=48", "rollout.max_turn_tokens=16", "rollout.max_steps=2"]


def trainer_overrides(model: str, world_dir: str | None, threads: int, quick: bool, tmp: Path, default_world: Path,
                      world_seed: int = 0) -> tuple[str, list[str]]:
    """``(model_path, overrides)`` for a benchmark trainer: no progress bars, TensorBoard or
    evaluations; the world of ``world_seed`` under ``world_dir`` (built if missing; default ``default_world``)."""
    from r3rag.evaluation.datasets import ensure_world

    model_path, extra = model, []
    if quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model_path, extra = str(save_tiny_model(tmp / "tiny")), list(QUICK_OVERRIDES)
    size = "small" if quick else "medium"
    world = ensure_world(Path(world_dir) if world_dir else (tmp / "world" if quick else default_world), seed=world_seed, size=size)
    return model_path, [f"model.path={model_path}", f"model.threads={threads}", f"data.world_dir={world}",
                        f"data.world_seed={world_seed}", f"data.world_size={size}",
                        "train.progress=false", "train.tensorboard=false", "train.eval_at_start=false", "train.eval_at_end=false",
                        *extra]


def add_trainer_args(p: argparse.ArgumentParser, root: Path) -> None:
    """The flags every RL benchmark takes: ``--quick``, ``--config``, ``--model``, ``--world-dir``,
    ``--world-seed``, ``--threads``, ``--repeats`` and ``--set``."""
    p.add_argument("--quick", action="store_true", help="tiny random model and a small world (seconds)")
    p.add_argument("--config", default=str(root / "configs/rl/world_sft_grpo.yaml"), help="RL config (default: %(default)s)")
    p.add_argument("--model", default="smollm2", help="policy checkpoint (default: %(default)s)")
    p.add_argument("--world-dir", default=None, help="world folder (default: a medium world under runs/)")
    p.add_argument("--world-seed", type=int, default=0, help="the world's seed (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=1, help="alternating passes over the settings (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="more RL config overrides (repeatable)")


def trainer_overrides_for(args: argparse.Namespace, tmp: Path, root: Path) -> tuple[str, list[str]]:
    """:func:`trainer_overrides` from the flags of :func:`add_trainer_args`."""
    return trainer_overrides(args.model, args.world_dir, args.threads, args.quick, tmp, root / "runs" / "world-medium",
                             args.world_seed)

"""The RL benchmarks' shared setup (``benchmark/perf/rl_rollout.py``, ``rl_update.py``): the
config overrides that point a trainer at a checkpoint and a world, or, with ``quick``, at a tiny
random model and a small world built on the spot (seconds, for ``make bench``)."""

from __future__ import annotations

from pathlib import Path

# a tiny random model never answers: keep its all-same groups and keep its turns short
QUICK_OVERRIDES = ["algo.dynamic_filtering=false", "rollout.max_new_tokens=48", "rollout.max_turn_tokens=16", "rollout.max_steps=2"]


def trainer_overrides(model: str, world_dir: str | None, threads: int, quick: bool, tmp: Path, default_world: Path) -> tuple[str, list[str]]:
    """``(model_path, overrides)`` for a benchmark trainer: no progress bars, TensorBoard or
    evaluations; the world under ``world_dir`` (built if missing; default ``default_world``)."""
    from r3rag.evaluation.datasets import ensure_world

    model_path, extra = model, []
    if quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model_path, extra = str(save_tiny_model(tmp / "tiny")), list(QUICK_OVERRIDES)
    size = "small" if quick else "medium"
    world = ensure_world(Path(world_dir) if world_dir else (tmp / "world" if quick else default_world), size=size)
    return model_path, [f"model.path={model_path}", f"model.threads={threads}", f"data.world_dir={world}", f"data.world_size={size}",
                        "train.progress=false", "train.tensorboard=false", "train.eval_at_start=false", "train.eval_at_end=false",
                        *extra]

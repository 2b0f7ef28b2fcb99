"""The training stages: cold start, SFT and RL, each its own program run as a child process.

Each stage runs ``python SCRIPT --config CONFIG --out WORK/<stage> --set <wiring> --set <extra>``
(``--set output_dir=WORK/sft`` for train/sft.py, whose config names its output folder)
where the wiring points the program at this pipeline's world, retrieval service, base model and
previous checkpoint, and ``<extra>`` is the preset's ``<stage>.set`` list. The programs resume
on their own (kept trajectories, LLaMA-Factory's checkpoints, the RL trainer's checkpoints), so
rerunning a killed stage continues it. After the program exits, the stage reads what it wrote
and decides whether it is usable (:mod:`r3rag.pipeline.checks`); an unusable stage raises
:class:`~r3rag.pipeline.runner.StageUnusable` and is not marked done.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, Callable

from r3rag.errors import ConfigError
from r3rag.pipeline import checks
from r3rag.pipeline.child import run_child
from r3rag.pipeline.config import QuickstartConfig, TrainStageSection
from r3rag.pipeline.runner import Context


def _dump(ctx: Context, name: str) -> Any:
    section = ctx.cfg.model_dump(mode="json")[name]
    section.pop("keep_resume_checkpoints", None)  # changes what is left on disk, not what the stage made
    return section


def profile_file(ctx: Context) -> Path:
    """The quickstart's rollout profile as an absolute path (relative ones from the repository root)."""
    from r3rag.rollout.profile import profile_path

    p = Path(ctx.cfg.profile)
    if not p.is_absolute() and (ctx.repo_root / p).is_file():
        p = ctx.repo_root / p
    return profile_path(p).resolve()


def profile_settings(ctx: Context) -> dict[str, Any]:
    """The profile's values (not its path): a stage is redone when a budget changes."""
    from r3rag.rollout.profile import load_profile

    return load_profile(profile_file(ctx)).model_dump()


def coldstart_settings(ctx: Context) -> Any:
    return {"coldstart": _dump(ctx, "coldstart"), "base": ctx.cfg.model.base, "profile": profile_settings(ctx)}


def precision_setting(ctx: Context) -> dict[str, str]:
    """``model.precision`` in a stage's fingerprint only when set, so that work folders finished
    before the option existed stay finished."""
    return {} if ctx.cfg.model.precision == "auto" else {"precision": ctx.cfg.model.precision}


def sft_settings(ctx: Context) -> Any:
    return {"sft": _dump(ctx, "sft"), "base": ctx.cfg.model.base, "profile": profile_settings(ctx), **precision_setting(ctx)}


def rl_settings(ctx: Context) -> Any:
    """RL's settings; ``rl.start`` and the base model only when RL starts from the base, so that
    work folders finished before the option existed stay finished."""
    section = _dump(ctx, "rl")
    if section.get("start") == "sft":
        section.pop("start")
        return {"rl": section, "profile": profile_settings(ctx), **precision_setting(ctx)}
    return {"rl": section, "base": ctx.cfg.model.base, "profile": profile_settings(ctx), **precision_setting(ctx)}


def rl_start(ctx: Context) -> str:
    """The model RL starts from: the SFT stage's checkpoint, or with ``rl.start: base`` the
    prompted base model itself (``model.base``: R1-Searcher's no-cold-start recipe)."""
    from r3rag.pipeline.stages import checkpoint_of

    return ctx.cfg.model.base if ctx.cfg.rl.start == "base" else checkpoint_of(ctx, "sft")


def _program(ctx: Context, section: TrainStageSection, out: Path, wiring: list[str]) -> list[str]:
    script = Path(section.script)
    script = script if script.is_absolute() else ctx.repo_root / script
    if not script.is_file():
        raise ConfigError(f"{section.script}: the stage's program is not there (is this a checkout of r3rag?)")
    cmd = [sys.executable, str(script)]
    if section.config:
        cfg_path = Path(section.config)
        cfg_path = cfg_path if cfg_path.is_absolute() else ctx.repo_root / cfg_path
        if not cfg_path.is_file():
            raise ConfigError(f"{section.config}: config file not found")
        cmd += ["--config", str(cfg_path)]
    if section.out_arg.startswith("-"):
        cmd += [section.out_arg, str(out)]
    else:
        wiring = [f"{section.out_arg}={out}", *wiring]
    for item in [*wiring, *section.set]:
        cmd += ["--set", item]
    return cmd


def _world_wiring(ctx: Context, prefix: str) -> list[str]:
    from r3rag.pipeline.stages import world_dir

    cfg: QuickstartConfig = ctx.cfg
    return [f"{prefix}.name=world", f"{prefix}.world_dir={world_dir(ctx)}", f"{prefix}.world_seed={cfg.world.seed}",
            f"{prefix}.world_size={cfg.world.size}"]


def _run_stage_program(ctx: Context, name: str, section: TrainStageSection, wiring: list[str]) -> Path:
    out = ctx.stage_dir(name)
    cmd = _program(ctx, section, out, wiring)
    run_child(cmd, log_path=out / "pipeline.log", cwd=ctx.repo_root, timeout_s=section.timeout_s, echo=ctx.echo_children)
    return out


RESUME_CHECKPOINTS = {"sft": "checkpoint-*", "rl": "**/checkpoints"}  # LLaMA-Factory's; the RL trainer's (each stage's)


def drop_resume_checkpoints(ctx: Context, name: str) -> list[Path]:
    """Once a training stage is done, its resume checkpoints are dead weight (SmolLM2 with the
    optimizer state: about 1.6 GB each; a few seeds' runs filled a 100 GB disk): remove them unless
    ``<stage>.keep_resume_checkpoints``. The final model and the logs stay. Returns what was removed."""
    from r3rag.pipeline.state import PipelineState

    if getattr(ctx.cfg, name).keep_resume_checkpoints:
        return []
    out = ctx.work / name
    recorded = ((PipelineState(ctx.work).get(name) or {}).get("summary") or {}).get("checkpoint")
    keep = {Path(recorded).resolve(), *Path(recorded).resolve().parents} if recorded else set()  # the stage's model
    gone = [p for p in sorted(out.glob(RESUME_CHECKPOINTS[name])) if p.is_dir() and not p.is_symlink() and p.resolve() not in keep]
    for p in gone:
        shutil.rmtree(p)
    return gone


def clean_after(name: str) -> Callable[[Context], None]:
    """The stage's ``after_done``: drop its resume checkpoints and say so; a failure to delete is a
    warning (the stage is done either way), not a crash."""

    def after_done(ctx: Context) -> None:
        try:
            gone = drop_resume_checkpoints(ctx, name)
        except OSError as err:
            ctx.echo(f"          {name}: could not delete its resume checkpoints ({err}); the stage is done, delete them by hand")
            return
        if gone:
            ctx.echo(f"          {name}: deleted {len(gone)} resume checkpoint folder(s) (the final model stays; "
                     f"--set {name}.keep_resume_checkpoints=true keeps them)")

    return after_done


def run_coldstart(ctx: Context) -> dict[str, Any]:
    from r3rag.pipeline.stages import retrieval_url, world_dir

    cfg: QuickstartConfig = ctx.cfg
    # the teacher writes in the student's tokenizer, so the kept ids are exact for its SFT
    wiring = [f"data.questions={world_dir(ctx) / 'train.jsonl'}", f"retriever.urls=[{retrieval_url(ctx)}]",
              "retriever.index_dir=null", f"teacher.tokenizer={cfg.model.base}", f"rollout.profile={profile_file(ctx)}"]
    if cfg.coldstart.limit:
        wiring.append(f"data.limit={cfg.coldstart.limit}")
    out = _run_stage_program(ctx, "coldstart", cfg.coldstart, wiring)
    return checks.check_coldstart(out, cfg.coldstart.min_kept)


#: written by train/envs/llamafactory.sh once the environment imports LLaMA-Factory
LLAMAFACTORY_STAMP = ".r3rag-llamafactory-installed"


def sft_preflight(ctx: Context) -> None:
    """The real train/sft.py needs LLaMA-Factory's own environment: say so before cold start runs."""
    import os

    cfg: QuickstartConfig = ctx.cfg
    if Path(cfg.sft.script).name != "sft.py" or Path(cfg.sft.script).parent.name != "train":
        return  # another program: its own business
    venv = Path(os.environ.get("R3RAG_LLAMAFACTORY_VENV") or ctx.repo_root / ".venvs" / "llamafactory")
    by_hand = any(item.startswith("launch.venv=") for item in cfg.sft.set)
    if by_hand:
        venv = Path(next(i for i in cfg.sft.set if i.startswith("launch.venv=")).split("=", 1)[1])
    if not (venv / "bin" / "python").is_file():
        raise ConfigError(f"the sft stage needs LLaMA-Factory's environment at {venv}: create it once with "
                          "`bash train/envs/llamafactory.sh` (about 2 minutes), or run --stages world-coldstart for now")
    # the script writes its stamp only after the finished environment imported LLaMA-Factory; an
    # environment without it is still being created (its CUDA torchvision not yet removed) or broke
    if not by_hand and not (venv / LLAMAFACTORY_STAMP).is_file():
        raise ConfigError(f"LLaMA-Factory's environment at {venv} is not finished ({LLAMAFACTORY_STAMP} missing): it is "
                          "still being created, or its creation failed; wait for `bash train/envs/llamafactory.sh` "
                          "or rerun it (--force rebuilds it)")


def run_sft(ctx: Context) -> dict[str, Any]:
    cfg: QuickstartConfig = ctx.cfg
    data = ctx.work / "coldstart"
    # the cutoff follows the profile the chains were written under: none is cut (train/sft.py refuses longer ones)
    wiring = [f"model={cfg.model.base}", f"data.dataset_dir={data}", f"rollout_profile={profile_file(ctx)}"]
    if cfg.model.precision != "auto":  # else the config's own (auto: the same rule)
        wiring.append(f"train.precision={cfg.model.precision}")
    out = _run_stage_program(ctx, "sft", cfg.sft, wiring)
    return checks.check_sft(out, require_loss_drop=cfg.sft.require_loss_drop)


def rl_check_wiring(ctx: Context) -> list[str]:
    """RL's own before/after evaluation. With ``rl.reward_check`` N > 0: the first N questions of
    its own training order, answered greedily by the SFT model before training and by the RL model
    after, each scored by the run's reward recipe (the report pairs the two: did RL move the
    reward it optimised, on the questions it trained on?). With 0: as before, held-out accuracy
    on the world's ``rl.monitor_split`` (test), never the report's ``eval.split``."""
    cfg: QuickstartConfig = ctx.cfg
    n = cfg.rl.reward_check
    if n:
        return ["eval.questions=training", f"eval.dataset.limit={n}", "train.eval_at_start=true", "train.eval_at_end=true"]
    return [*_world_wiring(ctx, "eval.dataset"), f"eval.dataset.split={cfg.rl.monitor_split}"]


def run_rl(ctx: Context) -> dict[str, Any]:
    from r3rag.pipeline.stages import retrieval_url

    cfg: QuickstartConfig = ctx.cfg
    start = rl_start(ctx)
    wiring = [f"model.path={start}", *_world_wiring(ctx, "data"), "data.split=train",
              f"retriever.urls=[{retrieval_url(ctx)}]", *rl_check_wiring(ctx), f"rollout.profile={profile_file(ctx)}"]
    if cfg.model.precision != "auto":
        wiring.append(f"model.compute_dtype={cfg.model.precision}")
    out = _run_stage_program(ctx, "rl", cfg.rl, wiring)
    summary = checks.check_rl(out, require_signal=cfg.rl.require_signal)
    if cfg.eval.null_control and cfg.rl.start == "sft":  # the null control moves the SFT checkpoint
        summary["null_control"] = str(write_null_control(Path(start), Path(summary["checkpoint"]), out / NULL_CONTROL))
    return summary


#: the RL stage's null control, beside its final model
NULL_CONTROL = "null-control"


def write_null_control(start: Path, trained: Path, out: Path, seed: int = 0) -> Path:
    """The null control of an RL update: ``start + s * (trained - start)`` with ``s`` = +-1 drawn
    per parameter (:func:`r3rag.train.rl.update_noise.random_sign_update`), written as an HF folder
    at ``out`` (kept when already there: a rerun reuses it). Every parameter moves exactly as far
    as RL moved it, in a random direction: evaluated beside RL, it shows what an update of that
    size costs a greedy student when its direction carries nothing."""
    from r3rag.train.rl.update_noise import load_weights, random_sign_update, write_like

    if checks.is_checkpoint(out):
        return out.resolve()
    if out.exists():  # a torn copy from a kill (write_like writes beside it, then renames)
        shutil.rmtree(out)
    flipped = random_sign_update(load_weights(start), load_weights(trained), seed=seed)
    return write_like(trained, flipped, out).resolve()


def null_control_of(ctx: Context) -> str:
    """The RL stage's null control (written now if an older RL stage did not write it)."""
    from r3rag.pipeline.stages import checkpoint_of
    from r3rag.pipeline.state import PipelineState

    summary = (PipelineState(ctx.work).get("rl") or {}).get("summary") or {}
    path = summary.get("null_control")
    if path and checks.is_checkpoint(Path(path)):
        return str(path)
    return str(write_null_control(Path(checkpoint_of(ctx, "sft")), Path(checkpoint_of(ctx, "rl")),
                                  ctx.work / "rl" / NULL_CONTROL))

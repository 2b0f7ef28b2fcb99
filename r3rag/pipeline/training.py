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


def coldstart_settings(ctx: Context) -> Any:
    return {"coldstart": _dump(ctx, "coldstart"), "base": ctx.cfg.model.base}


def precision_setting(ctx: Context) -> dict[str, str]:
    """``model.precision`` in a stage's fingerprint only when set, so that work folders finished
    before the option existed stay finished."""
    return {} if ctx.cfg.model.precision == "auto" else {"precision": ctx.cfg.model.precision}


def sft_settings(ctx: Context) -> Any:
    return {"sft": _dump(ctx, "sft"), "base": ctx.cfg.model.base, **precision_setting(ctx)}


def rl_settings(ctx: Context) -> Any:
    """RL's settings; ``rl.start`` and the base model only when RL starts from the base, so that
    work folders finished before the option existed stay finished."""
    section = _dump(ctx, "rl")
    if section.get("start") == "sft":
        section.pop("start")
        return {"rl": section, **precision_setting(ctx)}
    return {"rl": section, "base": ctx.cfg.model.base, **precision_setting(ctx)}


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
              "retriever.index_dir=null", f"teacher.tokenizer={cfg.model.base}"]
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
    wiring = [f"model={cfg.model.base}", f"data.dataset_dir={data}"]
    if cfg.model.precision != "auto":  # else the config's own (auto: the same rule)
        wiring.append(f"train.precision={cfg.model.precision}")
    out = _run_stage_program(ctx, "sft", cfg.sft, wiring)
    return checks.check_sft(out, require_loss_drop=cfg.sft.require_loss_drop)


def run_rl(ctx: Context) -> dict[str, Any]:
    from r3rag.pipeline.stages import retrieval_url

    cfg: QuickstartConfig = ctx.cfg
    # RL watches its held-out accuracy on the world's test split; the quickstart's own evaluation
    # uses eval.split (dev by default), so no number in the report was seen while training.
    wiring = [f"model.path={rl_start(ctx)}", *_world_wiring(ctx, "data"), "data.split=train",
              f"retriever.urls=[{retrieval_url(ctx)}]", *_world_wiring(ctx, "eval.dataset"),
              f"eval.dataset.split={cfg.rl.monitor_split}"]
    if cfg.model.precision != "auto":
        wiring.append(f"model.compute_dtype={cfg.model.precision}")
    out = _run_stage_program(ctx, "rl", cfg.rl, wiring)
    return checks.check_rl(out, require_signal=cfg.rl.require_signal)

"""The main job on the embedded world: ``make quickstart`` (``python -m r3rag.quickstart``).

Trains a small model to reason and retrieve step by step, on a CPU, and shows with confidence
intervals what each stage bought:

  world      generate the embedded world (seeded)                     WORK/world
  index      build its BM25 index; serve it on 127.0.0.1              WORK/index
  coldstart  the world's teacher answers train questions; correct
             chains are kept as SFT data                              WORK/coldstart
  sft        fine-tune SmolLM2-135M-Instruct on them (LLaMA-Factory)  WORK/sft
  rl         RL from the SFT checkpoint                               WORK/rl
  eval       base, SFT, RL and RL's null control on the same
             held-out questions                                       WORK/eval/<run>
  report     table with 95% CIs, paired differences, RL curves,
             two questions before/after training, the claims         WORK/report

One progress line per stage with its elapsed time. Every stage is resumable: a rerun (also after
Ctrl-C or SIGKILL) skips the finished stages (done markers in WORK/.done) and continues the
unfinished one. The retrieval service is stopped at the end, also on Ctrl-C and on failure.

Presets (configs/quickstart/): full (the default: >= 300 held-out questions), fast (--fast: fewer
held-out questions and less training; its intervals are wider), prompted (the evaluation-only
quickstart: the prompted base model with several methods, no training), from-base (RL from the
prompted base, no cold start and no SFT, against that base: format-valid answers, retrievals by
hop count, EM).

Examples:
  python -m r3rag.quickstart                         # the full pipeline
  python -m r3rag.quickstart --fast                  # the fast preset
  python -m r3rag.quickstart --preset prompted       # evaluation only (no training)
  python -m r3rag.quickstart --preset from-base      # RL from the prompted base (no cold start)
  python -m r3rag.quickstart --stages world-sft      # a prefix; --stages eval,report: a subset
  python -m r3rag.quickstart --set world.seed=1 --work runs/qs-seed1
  python -m r3rag.quickstart --redo rl               # redo RL (and what reads it)

Exit status: 0 done; 2 a bad flag, config or input; 3 a stage produced nothing usable (no
cold-start data kept, SFT loss not falling, RL reward flat with every group filtered) or a service
failed during the evaluation (a rerun retries exactly the failed questions); 4 with
--require-claims, a learning claim did not hold (SFT beat the base; RL moved its training reward
and did no harm beyond its null control; from-base: format-valid answers did not double; its EM
claim, the moonshot, and its search claim are reported, not required).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from r3rag.cli import ArgumentParser, run_main

_REPO_ROOT = Path(__file__).resolve().parents[1]
PRESET_DIR = _REPO_ROOT / "configs" / "quickstart"
EXIT_UNUSABLE = 3
EXIT_CLAIMS = 4


def preset_path(name: str) -> Path:
    from r3rag.errors import ConfigError

    p = Path(name)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise ConfigError(f"--preset {name}: file not found")
        return p
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = sorted(x.stem for x in PRESET_DIR.glob("*.yaml"))
        raise ConfigError(f"--preset {name!r}: no such preset; choose one of {', '.join(names)} or give a YAML path")
    return path


def build_parser() -> ArgumentParser:
    import argparse

    p = ArgumentParser(prog="python -m r3rag.quickstart", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="full", help="full | fast | prompted | from-base | a YAML path (default: %(default)s)")
    p.add_argument("--fast", action="store_true", help="the fast preset (same as --preset fast)")
    p.add_argument("--stages", default=None,
                   help="stages to run: a comma list (eval,report) or a range (world-sft); default: the preset's")
    p.add_argument("--redo", default="", help="comma list of stages to redo from scratch (and every stage after them)")
    p.add_argument("--work", default=None, help="working folder (default: the preset's, runs/quickstart)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a preset value, e.g. --set world.seed=1 --set eval.limit=100 (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="world seed (same as --set world.seed=N)")
    p.add_argument("--size", default=None, help="world size (same as --set world.size=SIZE)")
    p.add_argument("--limit", type=int, default=None, help="held-out questions (same as --set eval.limit=N; 0 = all)")
    p.add_argument("--methods", default=None, help="prompted base methods, comma-separated (eval.base_methods)")
    p.add_argument("--model", default=None, help="base model (model.base): 'smollm2', a folder or a .gguf")
    p.add_argument("--threads", type=int, default=None, help="torch threads in this process")
    p.add_argument("--require-claims", action="store_true", help=f"exit {EXIT_CLAIMS} unless every learning claim holds")
    return p


def load_quickstart_config(args) -> "object":  # noqa: ANN001 - argparse namespace
    from r3rag.config import load_config
    from r3rag.pipeline.config import QuickstartConfig

    overrides = []
    if args.work:
        overrides.append(f"work={args.work}")
    if args.seed is not None:
        overrides.append(f"world.seed={args.seed}")
    if args.size:
        overrides.append(f"world.size={args.size}")
    if args.limit is not None:
        overrides.append(f"eval.limit={args.limit if args.limit > 0 else 'null'}")
    if args.methods:
        overrides.append(f"eval.base_methods=[{args.methods}]")
    if args.model:
        overrides.append(f"model.base={args.model}")
    if args.threads:
        overrides.append(f"model.threads={args.threads}")
    if args.require_claims:
        overrides.append("report.require_claims=true")
    return load_config(QuickstartConfig, preset_path("fast" if args.fast else args.preset), [*overrides, *args.overrides])


def _echo(line: str) -> None:
    print(line, flush=True)  # in order with the stage programs' output, also through a pipe


def machine_note(budget_min: float | None, cpuinfo: str | Path = "/proc/cpuinfo", precision: str = "auto") -> str:
    """The start-up line naming the CPU and the precision every stage runs in, with the reason
    (:func:`r3rag.precision.choose_precision`, the rule each stage applies itself); where that is
    float32 it says, before an hour is spent, that the preset's time budget was measured with bf16.

    >>> machine_note(None, cpuinfo="/nonexistent").startswith("machine: unknown")
    True
    """
    from r3rag.machine import cpu_name
    from r3rag.precision import choose_precision

    p = choose_precision(precision, "cpu", cpuinfo=cpuinfo)
    line = f"machine: {cpu_name(cpuinfo)}, {os.cpu_count()} cores; precision {p.name} (asked {p.requested}): {p.reason}"
    if p.name == "bf16":
        return line
    line += "; every stage runs in float32"
    if budget_min is not None:
        line += (f", about 3x slower than on the CPUs the {budget_min:g}-minute budget was measured on "
                 "(docs/quickstart.md, \"On an AVX2-only CPU\")")
    return line


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from r3rag.evaluation.methods import check_method
    from r3rag.pipeline.runner import Context, StageUnusable, run_pipeline
    from r3rag.pipeline.stages import build_stages, parse_stages

    cfg = load_quickstart_config(args)
    for m in [*cfg.eval.base_methods, *cfg.eval.extra_methods, cfg.eval.trained_method]:
        check_method(m)
    wanted = parse_stages(args.stages) if args.stages else parse_stages(",".join(cfg.stages))
    redo = parse_stages(args.redo) if args.redo else []
    if cfg.model.threads:
        import torch

        torch.set_num_threads(cfg.model.threads)
    ctx = Context(cfg=cfg, work=Path(cfg.work), repo_root=_REPO_ROOT, echo=_echo)
    print(f"r3rag quickstart: preset {cfg.preset}, work {cfg.work}, stages {', '.join(wanted)}", flush=True)
    print(machine_note(cfg.report.budget_min, precision=cfg.model.precision), flush=True)
    try:
        run_pipeline(ctx, build_stages(cfg), wanted, redo=redo)
    except StageUnusable as err:
        again = f" (fix the cause, then rerun with --redo {err.stage})" if err.stage else ""
        print(f"error: a stage produced nothing usable: {err}{again}", file=sys.stderr)
        return EXIT_UNUSABLE
    report = ctx.outputs.get("report")
    if report is None:
        return 0
    print()
    print(report["table"])
    if report["others"]:
        print("\n".join(report["others"]))
    if report["diff_table"]:
        print()
        print(report["diff_table"])
    print()
    for c in report["claims"]:
        print(c["text"])
    if cfg.report.fast_note:
        print(f"(fast preset: {report['n']} held-out questions, so the intervals are wider than the full preset's)")
    if cfg.report.budget_min:
        over = report["total_s"] > 60 * cfg.report.budget_min
        print(f"stage time in all: {report['total_s'] / 60:.1f} min ({'OVER' if over else 'within'} the {cfg.preset} "
              f"preset's budget of {cfg.report.budget_min:g} min)")
    print(f"report: {Path(cfg.work) / 'report' / 'quickstart.md'}")
    if report.get("checkpoint"):
        print(f"demo with the trained model: bash startup/startup_visualize.sh --model {report['checkpoint']}")
    if cfg.report.require_claims and not all(c["holds"] for c in report["claims"] if c.get("required", True)):
        print("error: the learning claims did not all hold (see above)", file=sys.stderr)
        return EXIT_CLAIMS
    return 0


if __name__ == "__main__":
    run_main(main)

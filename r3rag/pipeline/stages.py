"""The quickstart's stages, in order, by name.

=============  ==============================================================================
``world``      generate the embedded world (seeded) into ``WORK/world``
``index``      build its BM25 index into ``WORK/index``; the retrieval service (127.0.0.1, a free
               port) is started on first use by any stage and stopped when the pipeline ends
``coldstart``  the world's teacher answers train questions; correct chains kept (``WORK/coldstart``)
``sft``        SmolLM2 fine-tuned on them through LLaMA-Factory (``WORK/sft``: a checkpoint)
``rl``         RL from the SFT checkpoint, or with ``rl.start: base`` from the prompted base model
               (``WORK/rl``: a checkpoint, metrics, curves)
``eval``       the base model, the SFT and the RL checkpoints and RL's null control (its update
               with random signs) on the same held-out questions (``WORK/eval/<run>``)
``report``     the table with 95% intervals and paired differences, the curves, two example
               questions before and after training, the learning claims (``WORK/report``)
=============  ==============================================================================

:func:`build_stages` returns them for a config; which trained models the evaluation covers
follows from the stages the preset lists (``stages``): a preset without ``sft``/``rl`` is the
prompted-models-only evaluation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from r3rag.errors import ConfigError
from r3rag.pipeline.config import QuickstartConfig
from r3rag.pipeline.runner import Context, Stage

if TYPE_CHECKING:
    from r3rag.evaluation.runner import RunOutcome

STAGE_ORDER = ("world", "index", "coldstart", "sft", "rl", "eval", "report")


# --- world and retrieval -------------------------------------------------------------------------


def world_dir(ctx: Context) -> Path:
    return ctx.work / "world"


def index_dir(ctx: Context) -> Path:
    return ctx.work / "index"


def count_lines(path: Path) -> int:
    if not path.is_file():
        return 0
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.strip())


def run_world(ctx: Context) -> dict[str, Any]:
    from r3rag.world import build_world

    cfg: QuickstartConfig = ctx.cfg
    out = world_dir(ctx)
    manifest = out / "manifest.json"  # the builder writes it last: present = a finished build
    if not manifest.is_file():
        build_world(out, seed=cfg.world.seed, size=cfg.world.size, clusters=cfg.world.clusters,
                    questions_per_cluster=cfg.world.questions_per_cluster)
    counts = {s: count_lines(out / f"{s}.jsonl") for s in ("train", "dev", "test")}
    held = counts.get(cfg.eval.split, 0)
    if cfg.eval.split not in counts:
        raise ConfigError(f"eval.split {cfg.eval.split!r}: the world has train, dev and test")
    if cfg.eval.split == "train":
        raise ConfigError("eval.split train: the training stages train on it; evaluate on dev or test")
    if cfg.eval.skip >= held:
        raise ConfigError(f"eval.skip={cfg.eval.skip}: the world's {cfg.eval.split} split has only {held} questions")
    left = held - cfg.eval.skip
    n_eval = min(left, cfg.eval.limit or left)
    where = f" (positions {cfg.eval.skip + 1}-{cfg.eval.skip + n_eval})" if cfg.eval.skip else ""
    return {"dir": str(out), "questions": counts, "passages": count_lines(out / "corpus.jsonl"), "eval_questions": n_eval,
            "line": f"seed {cfg.world.seed}, size {cfg.world.size}: {counts['train']} train / {held} {cfg.eval.split} "
                    f"questions, {n_eval} held out for the evaluation{where}"}


def run_index(ctx: Context) -> dict[str, Any]:
    from r3rag.retrieval.bm25_index import build_bm25
    from r3rag.retrieval.manifest import MANIFEST_NAME

    out = index_dir(ctx)
    if not (out / MANIFEST_NAME).is_file():
        build_bm25(world_dir(ctx) / "corpus.jsonl", out, name="world", show_progress=False)
    url = retrieval_url(ctx)
    return {"dir": str(out), "line": f"BM25 index {out}, service {url}"}


def retrieval_url(ctx: Context) -> str:
    """The retrieval service's URL, started on first use in this invocation (stopped at the end)."""

    def open_service() -> tuple[str, Any]:
        from r3rag.retrieval.service import serve_in_thread

        handle = serve_in_thread([index_dir(ctx)], bm25_backend=ctx.cfg.retrieval.bm25_backend)
        ctx.echo(f"          retrieval service: {handle.url} (stopped when the pipeline ends)")
        return handle.url, handle.stop

    return ctx.resource("retrieval service", open_service)


# --- evaluation ----------------------------------------------------------------------------------


def trained_models(cfg: QuickstartConfig) -> list[str]:
    """The training stages whose checkpoint the evaluation covers (those the preset runs)."""
    return [s for s in ("sft", "rl") if s in cfg.stages and getattr(cfg, s).enabled]


def checkpoint_of(ctx: Context, stage: str) -> str:
    """The model folder a training stage finished with; ``rl_null``: RL's null control."""
    from r3rag.pipeline.state import PipelineState

    if stage == NULL_ROLE:
        from r3rag.pipeline.training import null_control_of

        return null_control_of(ctx)

    marker = PipelineState(ctx.work).get(stage)
    ckpt = (marker or {}).get("summary", {}).get("checkpoint")
    if not ckpt or not Path(ckpt).exists():
        raise ConfigError(f"no {stage} checkpoint in {ctx.work}: run --stages {stage} first, "
                          f"or leave it out of the evaluation with --set {stage}.enabled=false")
    return str(ckpt)


def eval_runs(ctx: Context) -> list[dict[str, Any]]:
    """``[{"name", "role", "method", "model", "overrides"}]``: every evaluation run of the stage."""
    from r3rag.pipeline.training import profile_file
    from r3rag.rollout.profile import load_profile

    cfg: QuickstartConfig = ctx.cfg
    # every run gets the profile's budgets as explicit keys: the trained models are evaluated with
    # the budgets they were trained under, whatever the evaluation config says
    path = profile_file(ctx)
    profile = [f"rollout.profile={path}", *load_profile(path).overrides("rollout")]
    runs = []
    for m in [*cfg.eval.base_methods, *[x for x in cfg.eval.extra_methods if x not in cfg.eval.base_methods]]:
        role = "base" if m in cfg.eval.base_methods else "extra"
        runs.append({"name": f"base-{m}" if role == "base" else m, "role": role, "method": m, "model": cfg.model.base,
                     "overrides": [*profile, f"rollout.prompt_variant={cfg.eval.base_prompt_variant}"]})
    trained = trained_models(cfg)
    if "rl" in trained and cfg.eval.null_control and cfg.rl.start == "sft":
        trained.append(NULL_ROLE)  # RL's update with random signs, evaluated as RL is
    for stage in trained:
        runs.append({"name": NULL_RUN if stage == NULL_ROLE else stage, "role": stage, "method": cfg.eval.trained_method,
                     "model": None,
                     "overrides": [*profile, f"rollout.prompt_variant={cfg.eval.trained_prompt_variant}", *cfg.eval.trained_set]})
    return runs


#: the evaluation run of RL's null control, and its role (it reads the RL stage's outputs)
NULL_RUN, NULL_ROLE = "rl-null", "rl_null"


def run_order(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trained checkpoints first, then the packaged base model's runs.

    The base model loads from its GGUF file, and after transformers has loaded a GGUF model,
    decoding in the same process is about 1.36x slower for the rest of its life: the same CPU time,
    but 375k voluntary context switches instead of 2.6k in 64 questions (docs/results/quickstart.md,
    "Evaluation order"). Evaluated first, the base would slow the SFT and RL runs behind it."""
    return sorted(runs, key=lambda r: r["role"] in ("base", "extra"))  # stable: the table's order within each


def eval_dtype(name: str, precision: str = "auto") -> str:
    """The evaluation's model dtype: ``name``, or where it is ``auto`` the quickstart's
    ``model.precision``, through the one rule (:func:`r3rag.precision.choose_precision`): bfloat16
    where the CPU has native bf16 arithmetic (avx512_bf16 / amx_bf16), where it measured about 1.5x
    less CPU per evaluated question than float32 (docs/results/quickstart.md); float32 elsewhere."""
    from r3rag.precision import choose_precision

    return choose_precision(precision if name == "auto" else name, "cpu").torch_name


def _eval_settings(ctx: Context) -> dict[str, Any]:
    """The eval section as the stage's fingerprint sees it: ``skip`` only when set, so that work
    folders finished before the option existed stay finished."""
    section = ctx.cfg.model_dump(mode="json")["eval"]
    if not section.get("skip"):
        section.pop("skip", None)
    return section


def run_eval(ctx: Context) -> dict[str, Any]:
    from r3rag.config import load_config
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.evaluation.failures import EvaluationIncomplete
    from r3rag.evaluation.runner import run_evaluation

    cfg: QuickstartConfig = ctx.cfg
    url = retrieval_url(ctx)
    config_path = _repo_path(ctx, cfg.eval.config)
    done = {}
    runs = eval_runs(ctx)
    for run in run_order(runs):
        model = run["model"] or checkpoint_of(ctx, run["role"])
        overrides = [
            f"dataset.name=world", f"dataset.world_dir={world_dir(ctx)}", f"dataset.world_seed={cfg.world.seed}",
            f"dataset.world_size={cfg.world.size}", f"dataset.split={cfg.eval.split}", f"retriever.urls=[{url}]",
            f"method.name={run['method']}", f"model.path={model}", f"run.batch_size={cfg.eval.batch_size}",
            f"model.max_batch_size={cfg.eval.batch_size}", f"model.dtype={eval_dtype(cfg.eval.dtype, cfg.model.precision)}",
            f"run.bootstrap={cfg.report.bootstrap}", f"run.seed={cfg.report.seed}",
            *([f"dataset.limit={cfg.eval.limit}"] if cfg.eval.limit else []),
            *([f"dataset.skip={cfg.eval.skip}"] if cfg.eval.skip else []), *run["overrides"], *cfg.eval.set,
        ]
        ecfg = load_config(EvaluationConfig, config_path, overrides)  # a bad override fails here, once
        out = ctx.work / "eval" / run["name"]
        try:
            if cfg.eval.workers > 1:
                outcome = run_sharded_evaluation(ctx, config_path, overrides, out, cfg.eval.workers, progress=ecfg.run.progress)
            else:
                outcome = run_evaluation(ecfg, out)
        except EvaluationIncomplete as err:  # never a number built on a dead service: stop; a rerun retries them
            raise EvaluationIncomplete(f"evaluation {run['name']} ({run['method']}) stopped, nothing reported: {err}",
                                       err.outcome) from None
        m = outcome.results.get("metrics", {})
        ctx.echo(f"          {run['name']:<14} EM {m.get('em', 0.0):5.1f}  F1 {m.get('f1', 0.0):5.1f}  "
                 f"cover-EM {m.get('cover_em', 0.0):5.1f}  ({outcome.new} new, {outcome.skipped} reused)")
        done[run["name"]] = {"dir": str(outcome.out_dir), "role": run["role"], "model": model, "method": run["method"],
                             "metrics": m, "n": outcome.results.get("n", 0)}
    done = {r["name"]: done[r["name"]] for r in runs}  # the summary lists them in table order
    n = max((d["n"] for d in done.values()), default=0)
    return {"runs": done, "line": f"{len(done)} run(s) on {n} held-out {cfg.eval.split} questions"}


def run_sharded_evaluation(ctx: Context, config_path: str, overrides: list[str], out: Path, workers: int,
                           progress: bool = True) -> RunOutcome:
    """One evaluation run as ``workers`` processes at once, then merged into ``out``.

    Process ``i`` runs ``benchmark/evaluate.py run --shard i/workers`` into ``out/shards/i-of-N``
    (the questions at positions ``p % workers == i``) with ``threads // workers`` torch threads;
    :func:`r3rag.evaluation.merge.merge_runs` then writes ``out`` exactly as one unsharded run
    would (same rows, metrics and run key). On 2 cores, two 1-thread processes evaluated a
    trained checkpoint's 300 questions 1.21x faster than one 2-thread process
    (``benchmark/perf/eval_workers.py``, docs/results/quickstart.md). Each shard resumes on its own after a
    kill; only the first shows a progress bar. The shards run in this process's working folder,
    so relative paths in ``overrides`` mean what they mean here. A shard that a service failed
    (exit status 3) stops the others and raises :class:`~r3rag.evaluation.failures.EvaluationIncomplete`
    with the failed questions of every shard; the rerun resumes each shard and retries them."""
    import os
    import sys
    import torch

    from r3rag.evaluation.failures import FAILURES, EvaluationIncomplete, failure_line, latest_by_id
    from r3rag.evaluation.merge import merge_runs
    from r3rag.evaluation.predictions import load_rows
    from r3rag.evaluation.runner import RUN_INFO, RunOutcome
    from r3rag.pipeline.child import ChildFailed, run_children

    cfg: QuickstartConfig = ctx.cfg
    threads = max(1, (cfg.model.threads or torch.get_num_threads()) // workers)  # this process's threads, shared out
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    shard_root = out / "shards"
    shard_root.mkdir(parents=True, exist_ok=True)
    shards = [shard_root / f"{i}-of-{workers}" for i in range(workers)]
    sets = [x for o in overrides for x in ("--set", o)]
    cmds = [[sys.executable, str(ctx.repo_root / "benchmark" / "evaluate.py"), "run", "--config", config_path,
             "--out", str(d), "--shard", f"{i}/{workers}", *sets, *([] if progress and i == 0 else ["--no-progress"])]
            for i, d in enumerate(shards)]
    ctx.echo(f"          {out.name}: {workers} shard processes of {threads} thread(s) each; shard 0 shows its progress, "
             f"the others log to {shard_root}")
    try:
        run_children(cmds, log_paths=[shard_root / f"{d.name}.log" for d in shards],
                     envs=[env] * workers, echo=[ctx.echo_children and i == 0 for i in range(workers)])
    except ChildFailed:
        failed = [r for d in shards for r in latest_by_id(load_rows(d / FAILURES, repair=False)).values()]
        if not failed:
            raise
        raise EvaluationIncomplete(failure_line(failed, 0, None, out) + " (the other shards were stopped; the rerun resumes them)") from None
    results = merge_runs(shards, out)
    infos = [json.loads((d / RUN_INFO).read_text(encoding="utf-8")) for d in shards]
    return RunOutcome(out, results, new=sum(int(i.get("new", 0)) for i in infos),
                      skipped=sum(int(i.get("skipped", 0)) for i in infos))


def reset_eval(ctx: Context, redone: set[str]) -> None:
    """Remove the evaluation runs that read a redone stage's outputs: all of them after the world,
    the index or the evaluation itself; else only the redone checkpoints' (the base model's runs
    read nothing that changed, and they are the slow ones)."""
    import shutil

    everything = bool({"world", "index", "eval"} & redone)
    for run in eval_runs(ctx):
        d = ctx.work / "eval" / run["name"]
        reads = "rl" if run["role"] == NULL_ROLE else run["role"]
        if (everything or reads in redone) and d.is_dir():
            shutil.rmtree(d)


def _repo_path(ctx: Context, path: str) -> str:
    p = Path(path)
    if p.is_absolute() or p.exists():
        return str(p)
    return str(ctx.repo_root / p)


# --- the report ----------------------------------------------------------------------------------


def run_report(ctx: Context) -> dict[str, Any]:
    if ctx.cfg.report.kind == "from_base":  # RL from the prompted base: its own figures and claims
        from r3rag.pipeline.report_from_base import write_report
    else:
        from r3rag.pipeline.report import write_report

    report = write_report(ctx)
    ctx.outputs["report"] = report  # the CLI prints it after the pipeline
    return {"dir": str(ctx.work / "report"), "claims": report["claims"], "line": f"{ctx.work / 'report' / 'quickstart.md'}"}


# --- the registry --------------------------------------------------------------------------------


def build_stages(cfg: QuickstartConfig) -> list[Stage]:
    """Every stage, in pipeline order, with the needs and settings that ``cfg`` implies."""
    from r3rag.pipeline import training

    world_settings = lambda ctx: ctx.cfg.model_dump(mode="json")["world"]  # noqa: E731
    eval_needs = ("world", "index", *trained_models(cfg))
    stages = [
        Stage("world", "generate the embedded world", run_world, settings=world_settings),
        Stage("index", "index and serve the world", run_index, needs=("world",)),
        Stage("coldstart", "cold-start data from the world's teacher", training.run_coldstart, needs=("world", "index"),
              settings=training.coldstart_settings),
        Stage("sft", "SFT through LLaMA-Factory", training.run_sft, needs=("coldstart",), settings=training.sft_settings,
              preflight=training.sft_preflight, after_done=training.clean_after("sft")),
        Stage("rl", "RL from the prompted base" if cfg.rl.start == "base" else "RL from the SFT checkpoint", training.run_rl,
              needs=("world", "index") if cfg.rl.start == "base" else ("sft", "index"), settings=training.rl_settings,
              after_done=training.clean_after("rl")),
        Stage("eval", "evaluate on held-out questions", run_eval, needs=eval_needs, reset=reset_eval,
              settings=lambda ctx: {"eval": _eval_settings(ctx), "base": ctx.cfg.model.base,
                                    "bootstrap": ctx.cfg.report.bootstrap, "seed": ctx.cfg.report.seed,
                                    "profile": training.profile_settings(ctx), **training.precision_setting(ctx)}),
        Stage("report", "write the report", run_report, needs=("eval",), always=True),
    ]
    assert tuple(s.name for s in stages) == STAGE_ORDER
    return stages


def parse_stages(text: str) -> list[str]:
    """``"eval,report"`` or a range ``"world-sft"`` (inclusive) or ``"all"`` -> stage names."""
    text = text.strip()
    if text in ("", "all"):
        return list(STAGE_ORDER)
    out: list[str] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if "-" in part:
            a, b = (x.strip() for x in part.split("-", 1))
            a, b = a or STAGE_ORDER[0], b or STAGE_ORDER[-1]
            for x in (a, b):
                if x not in STAGE_ORDER:
                    raise ConfigError(f"--stages: unknown stage {x!r}; stages: {', '.join(STAGE_ORDER)}")
            i, j = STAGE_ORDER.index(a), STAGE_ORDER.index(b)
            if i > j:
                raise ConfigError(f"--stages {part}: {a} comes after {b}")
            out.extend(STAGE_ORDER[i:j + 1])
        else:
            if part not in STAGE_ORDER:
                raise ConfigError(f"--stages: unknown stage {part!r}; stages: {', '.join(STAGE_ORDER)}")
            out.append(part)
    return [s for s in STAGE_ORDER if s in out]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))

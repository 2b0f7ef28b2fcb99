"""Run one method over one dataset (or one shard of it), resumably, and write its report.

The order of work is chosen so that mistakes cost nothing:

1. the method name, normaliser and shard are checked, and the dataset is read and validated
   (a bad line fails here, naming file and line, before any model is loaded);
2. ``--out`` is checked: a folder holding a run with another key (every setting that can change
   the predictions: method, model, rollout, retrieval, dataset, normaliser, shard; see
   :mod:`r3rag.evaluation.run_key`) is refused with one line naming the setting that changed, so
   predictions of different settings are never mixed. The key is written to ``run.json`` before
   the first prediction, so a killed run is protected too. A larger ``dataset.limit`` (or none)
   extends a run; predictions outside this run's questions (a smaller limit), or whose question
   or gold answers differ from the dataset's, are refused. ``predictions.jsonl`` is read, a
   partial last line (a killed write) is cut off, and the ids already there are skipped;
3. only when questions are left is the method built (model and retriever loaded); questions go
   to it ``run.batch_size`` at a time and every finished row is appended and fsync'ed: a scored
   one to ``predictions.jsonl``, one that a service failed for (dead retriever, model server or
   judge: :mod:`r3rag.evaluation.failures`) to ``failures.jsonl``, never to the scores. The
   questions listed there are retried by the next run into the same folder;
4. the metrics are computed from the whole predictions file in dataset order, so a resumed run
   ends with the same ``results.json`` as an uninterrupted one. When a service failed for some
   questions, ``results.json`` says so (``complete: false``, ``failed`` per kind) and
   :class:`~r3rag.evaluation.failures.EvaluationIncomplete` is raised once every file is written.

``results.json`` holds only what the predictions determine (no timings, no shard); timings and
the run's identity go to ``run.json``, the full config to ``config.yaml``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from r3rag.config import dump_config
from r3rag.data.records import Question
from r3rag.errors import ConfigError
from r3rag.evaluation.aggregate import aggregate
from r3rag.evaluation.components import model_precision
from r3rag.evaluation.config import EvaluationConfig, parse_shard
from r3rag.evaluation.datasets import resolve_dataset, select_shard
from r3rag.evaluation.failures import (
    FAILURES, JUDGE_UNAVAILABLE, EvaluationIncomplete, counts, failure_line, failure_of, failure_row, latest_by_id,
    split_failed,
)
from r3rag.evaluation.methods import Method, build_method, check_method
from r3rag.evaluation.predictions import PREDICTIONS, RowWriter, load_rows, prediction_row, write_rows
from r3rag.evaluation.run_key import key_difference, run_key
from r3rag.metrics import get_normalizer

RESULTS = "results.json"
RUN_INFO = "run.json"


@dataclass
class RunOutcome:
    out_dir: Path
    results: dict[str, Any]
    new: int  # predictions this invocation added (retried questions included)
    skipped: int  # questions found already done
    retried: int = 0  # questions tried again after an infrastructure failure of an earlier run
    failed: dict[str, int] = field(default_factory=dict)  # kind -> questions a service failed (not scored)
    not_attempted: int = 0  # questions left for the rerun after the run stopped on a dead service

    @property
    def complete(self) -> bool:
        return not self.failed and not self.not_attempted


def model_label(cfg: EvaluationConfig) -> str:
    if cfg.method.name == "oracle":
        return "oracle"
    return cfg.model.api_model if cfg.model.backend == "openai" else cfg.model.path


def build_results(identity: dict[str, Any], rows: list[dict[str, Any]], bootstrap: int, seed: int) -> dict[str, Any]:
    head = {k: identity[k] for k in ("dataset", "method", "model", "normalization")}
    return {**head, **aggregate(rows, bootstrap=bootstrap, seed=seed)}


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)


#: what a folder written before run keys existed is checked on (n_total is not: a limit may grow)
LEGACY_KEYS = ("dataset", "method", "model", "normalization", "shard")


def _check_key(out: Path, identity: dict[str, Any], key: dict[str, Any]) -> None:
    """Refuse ``out`` if it holds a run whose key differs from this one (one line, naming it)."""
    info = out / RUN_INFO
    if not info.is_file():
        return
    try:
        old = json.loads(info.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        raise ConfigError(f"{info}: not a run record (JSON); use another --out") from None
    if "config_key" in old:
        diff = key_difference(old["config_key"], key)
    else:
        ident = old.get("identity", {})
        changed = [k for k in LEGACY_KEYS if k in ident and ident[k] != identity[k]]
        diff = f"{changed[0]}={ident[changed[0]]!r}, not {identity[changed[0]]!r}" if changed else None
    if diff:
        raise ConfigError(f"{out} holds a run with {diff}; use another --out")


def _check_rows(pred_path: Path, rows: list[dict[str, Any]], mine: list[tuple[int, Question]], limit: int | None) -> None:
    """Every existing row is one of this run's questions, with the same text and gold answers."""
    by_id = {q.id: (p, q) for p, q in mine}
    for r in rows:
        if r["id"] not in by_id:
            raise ConfigError(
                f"{pred_path}: id {r['id']!r} is not among this run's questions (dataset.limit={limit!r}, shard); "
                "a run is extended by a larger limit, never shrunk: use another --out"
            )
        p, q = by_id[r["id"]]
        if r.get("question") != q.question or list(r.get("golden_answers", [])) != list(q.golden_answers) or r.get("index") != p:
            raise ConfigError(f"{pred_path}: id {r['id']!r} was predicted for another version of the dataset "
                              "(question, gold answers or position differ); use another --out")


def _same_question(r: dict[str, Any], p: int, q: Question) -> bool:
    return r.get("question") == q.question and list(r.get("golden_answers", [])) == list(q.golden_answers) and r.get("index") == p


def _earlier_failures(out: Path, legacy: list[dict[str, Any]], mine: list[tuple[int, Question]]) -> dict[str, dict[str, Any]]:
    """The failure record of each of this run's questions that has one (``failures.jsonl``, after
    any failed rows an older version left in ``predictions.jsonl``); records of other questions
    or of another version of the dataset are dropped (they are not predictions: nothing is lost)."""
    by_id = {q.id: (p, q) for p, q in mine}
    rows = [failure_row(r) for r in legacy] + load_rows(out / FAILURES)
    return {i: r for i, r in latest_by_id(rows).items() if i in by_id and _same_question(r, *by_id[i])}


def _write_failures(out: Path, failed: list[dict[str, Any]]) -> None:
    path = out / FAILURES
    if failed:
        write_rows(path, sorted(failed, key=lambda r: r["index"]))
    elif path.exists():
        path.unlink()


def run_evaluation(cfg: EvaluationConfig, out_dir: str | Path) -> RunOutcome:
    """Run (or resume) one evaluation into ``out_dir``; see the module docstring.

    Raises :class:`~r3rag.evaluation.failures.EvaluationIncomplete` after writing every file when
    a service failed for some questions (:mod:`r3rag.evaluation.failures`): they are not scored,
    and a rerun retries exactly them."""
    check_method(cfg.method.name)
    try:
        get_normalizer(cfg.run.normalization)
    except ValueError as err:
        raise ConfigError(f"run.normalization: {err}") from None
    shard = parse_shard(cfg.run.shard) if cfg.run.shard else None
    dataset = resolve_dataset(cfg.dataset)  # validates every line before anything heavy happens
    mine = select_shard(dataset.questions, shard, dataset.first_position)
    out = Path(out_dir)
    identity = {
        "dataset": dataset.name, "source": dataset.source, "method": cfg.method.name, "model": model_label(cfg),
        "normalization": cfg.run.normalization, "n_total": len(dataset.questions), "shard": cfg.run.shard,
        "first_position": dataset.first_position,
    }
    key = run_key(cfg)
    out.mkdir(parents=True, exist_ok=True)
    pred_path = out / PREDICTIONS
    rows, legacy_failed = split_failed(load_rows(pred_path))
    earlier = _earlier_failures(out, legacy_failed, mine)
    if rows or legacy_failed or (out / FAILURES).is_file():  # a folder without either holds nothing that could be mixed
        _check_key(out, identity, key)
        _check_rows(pred_path, rows, mine, cfg.dataset.limit)
    if legacy_failed:  # an older version scored these: keep them apart, then out of the predictions
        _write_failures(out, list(earlier.values()))
        write_rows(pred_path, rows)
    (out / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    precision = model_precision(cfg.model)
    if precision is not None:
        precision.write(out, "evaluation")
    if not rows or not (out / RUN_INFO).is_file():
        write_json(out / RUN_INFO, {"identity": identity, "config_key": key})  # before the first prediction
    done = {r["id"] for r in rows}
    todo = [(p, q) for p, q in mine if q.id not in done]
    # a question whose prediction stands but whose judge failed is judged again, not generated again
    rejudge = [earlier[q.id] for _, q in todo
               if cfg.run.judge and earlier.get(q.id, {}).get("failure") == JUDGE_UNAVAILABLE and "scores" in earlier[q.id]]
    regenerate = [(p, q) for p, q in todo if q.id not in {r["id"] for r in rejudge}]
    started = time.perf_counter()
    attempt = _Attempt()
    if todo:
        asyncio.run(_run(cfg, dataset, regenerate, rejudge, pred_path, out / FAILURES, rows, len(mine), set(earlier), attempt))
    elapsed = time.perf_counter() - started
    rows = load_rows(pred_path)
    scored = {r["id"] for r in rows}
    failed = {**{i: r for i, r in earlier.items() if i not in attempt.tried}, **attempt.failed}
    failed = {i: r for i, r in failed.items() if i not in scored}
    _write_failures(out, list(failed.values()))
    not_attempted = len(mine) - len(scored) - len(failed)
    results = build_results(identity, rows, cfg.run.bootstrap, cfg.run.seed)
    if failed or not_attempted:
        results.update({"complete": False, "n_questions": len(mine), "failed": counts(failed.values()),
                        "not_attempted": not_attempted})
    write_json(out / RESULTS, results)
    new = len(scored) - len(done)
    write_json(out / RUN_INFO, {
        "identity": identity, "config_key": key, "questions_in_shard": len(mine), "new": new, "skipped": len(done),
        "retried": attempt.retried, "failed": counts(failed.values()), "not_attempted": not_attempted,
        "bootstrap": cfg.run.bootstrap, "seed": cfg.run.seed, "elapsed_s": round(elapsed, 3),
        "questions_per_s": round(len(attempt.tried) / elapsed, 4) if attempt.tried and elapsed > 0 else None,
    })
    from r3rag.evaluation.report import write_report

    write_report(out, results)
    outcome = RunOutcome(out, results, new=new, skipped=len(done), retried=attempt.retried,
                         failed=counts(failed.values()), not_attempted=not_attempted)
    if failed or not_attempted:
        line = failure_line(sorted(failed.values(), key=lambda r: r["index"]), not_attempted, len(mine), out,
                            stopped_early=attempt.stopped_early)
        raise EvaluationIncomplete(line, outcome)
    return outcome


@dataclass
class _Attempt:
    """What one invocation tried: question ids, those that failed again (id -> failure row), how
    many had failed before, and whether it stopped early on a dead service."""

    tried: set[str] = field(default_factory=set)
    failed: dict[str, dict[str, Any]] = field(default_factory=dict)
    retried: int = 0
    stopped_early: bool = False


async def _run(
    cfg: EvaluationConfig,
    dataset: Any,
    todo: list[tuple[int, Question]],
    rejudge: list[dict[str, Any]],
    pred_path: Path,
    fail_path: Path,
    previous: list[dict[str, Any]],
    total: int,
    earlier_failed: set[str],
    attempt: _Attempt,
) -> None:
    """Judge ``rejudge`` again, then generate ``todo`` batch by batch: a scored row goes to the
    predictions, a failed one to the failures file, each as soon as its batch is done. After
    ``run.stop_after_failed_batches`` batches in a row in which every question failed, the rest is
    left for the rerun (a dead service fails every question; asking it again and again is waste)."""
    from tqdm import tqdm

    judge = None
    if cfg.run.judge:
        from r3rag.rewards.judge.client import JudgeClient

        judge = JudgeClient(cfg.judge)
    correct = sum(float(r["scores"]["cover_em"]) for r in previous)
    count = len(previous)
    size = cfg.run.batch_size
    name = cfg.method.name
    bar = tqdm(total=total, initial=count, desc=name, unit="q", disable=not cfg.run.progress)
    method: Method | None = None
    dead_batches = 0
    try:
        with RowWriter(pred_path) as writer, RowWriter(fail_path) as fails:

            def keep(rows: list[dict[str, Any]]) -> int:
                nonlocal correct, count
                ok = 0
                for row in rows:
                    attempt.tried.add(row["id"])
                    attempt.retried += row["id"] in earlier_failed
                    if failure_of(row):
                        attempt.failed[row["id"]] = failure_row(row)
                        fails.write(attempt.failed[row["id"]])
                        continue
                    attempt.failed.pop(row["id"], None)
                    writer.write(row)
                    correct += float(row["scores"]["cover_em"])
                    count += 1
                    ok += 1
                bar.update(ok)
                bar.set_postfix(cover_em=f"{100 * correct / max(count, 1):.1f}", failed=len(attempt.failed))
                return ok

            for start in range(0, len(rejudge), size):
                chunk = [{k: v for k, v in r.items() if k not in ("failure", "error", "judge", "judge_error")}
                         for r in rejudge[start:start + size]]
                assert judge is not None
                await _judge(judge, chunk)
                keep(chunk)
            for start in range(0, len(todo), size):
                if method is None:
                    method = build_method(cfg, dataset)
                chunk = todo[start:start + size]
                trajs = await method.arun([q for _, q in chunk])
                rows = [prediction_row(p, q, t, cfg.run.normalization) for (p, q), t in zip(chunk, trajs)]
                if judge is not None:
                    await _judge(judge, rows)
                dead_batches = 0 if keep(rows) else dead_batches + 1
                limit = cfg.run.stop_after_failed_batches
                if limit and dead_batches >= limit and start + size < len(todo):
                    attempt.stopped_early = True
                    break
    finally:
        bar.close()
        if method is not None:
            await method.aclose()
        if judge is not None:
            judge.close()


async def _judge(judge: Any, rows: list[dict[str, Any]]) -> None:
    """Set ``row["judge"]``: 1.0/0.0, or ``None`` with ``row["judge_error"]`` when the judge gave
    no verdict (an infrastructure failure, :mod:`r3rag.evaluation.failures`). No answer is 0
    without a call; a row the infrastructure already failed is not judged."""
    asked = [r for r in rows if r["prediction"] and failure_of(r) is None]
    reqs = [judge.correctness_request(r["question"], r["prediction"], r["golden_answers"]) for r in asked]
    results = await judge.ajudge(reqs) if reqs else []
    for r in rows:
        r["judge"] = 0.0
        r.pop("judge_error", None)
    for r, res in zip(asked, results):
        r["judge"] = res.value
        if res.value is None:
            r["judge_error"] = f"judge {res.status}" + (f": {res.reply}" if res.reply else "")

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
   to it ``run.batch_size`` at a time and every finished row is appended and fsync'ed;
4. the metrics are computed from the whole predictions file in dataset order, so a resumed run
   ends with the same ``results.json`` as an uninterrupted one.

``results.json`` holds only what the predictions determine (no timings, no shard); timings and
the run's identity go to ``run.json``, the full config to ``config.yaml``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from r3rag.config import dump_config
from r3rag.data.records import Question
from r3rag.errors import ConfigError
from r3rag.evaluation.aggregate import aggregate
from r3rag.evaluation.components import model_precision
from r3rag.evaluation.config import EvaluationConfig, parse_shard
from r3rag.evaluation.datasets import resolve_dataset, select_shard
from r3rag.evaluation.methods import Method, build_method, check_method
from r3rag.evaluation.predictions import PREDICTIONS, RowWriter, load_rows, prediction_row
from r3rag.evaluation.run_key import key_difference, run_key
from r3rag.metrics import get_normalizer

RESULTS = "results.json"
RUN_INFO = "run.json"


@dataclass
class RunOutcome:
    out_dir: Path
    results: dict[str, Any]
    new: int  # questions answered by this invocation
    skipped: int  # questions found already done


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


def run_evaluation(cfg: EvaluationConfig, out_dir: str | Path) -> RunOutcome:
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
    rows = load_rows(pred_path)
    if rows:  # a folder without predictions holds nothing that could be mixed
        _check_key(out, identity, key)
        _check_rows(pred_path, rows, mine, cfg.dataset.limit)
    (out / "config.yaml").write_text(dump_config(cfg), encoding="utf-8")
    precision = model_precision(cfg.model)
    if precision is not None:
        precision.write(out, "evaluation")
    if not rows or not (out / RUN_INFO).is_file():
        write_json(out / RUN_INFO, {"identity": identity, "config_key": key})  # before the first prediction
    done = {r["id"] for r in rows}
    todo = [(p, q) for p, q in mine if q.id not in done]
    started = time.perf_counter()
    if todo:
        method = build_method(cfg, dataset)
        asyncio.run(_run(method, todo, cfg, pred_path, rows, total=len(mine)))
    elapsed = time.perf_counter() - started
    rows = load_rows(pred_path)
    results = build_results(identity, rows, cfg.run.bootstrap, cfg.run.seed)
    write_json(out / RESULTS, results)
    write_json(out / RUN_INFO, {
        "identity": identity, "config_key": key, "questions_in_shard": len(mine), "new": len(todo), "skipped": len(mine) - len(todo),
        "bootstrap": cfg.run.bootstrap, "seed": cfg.run.seed, "elapsed_s": round(elapsed, 3), "questions_per_s": round(len(todo) / elapsed, 4) if todo and elapsed > 0 else None,
    })
    from r3rag.evaluation.report import write_report

    write_report(out, results)
    return RunOutcome(out, results, new=len(todo), skipped=len(mine) - len(todo))


async def _run(
    method: Method,
    todo: list[tuple[int, Question]],
    cfg: EvaluationConfig,
    pred_path: Path,
    previous: list[dict[str, Any]],
    total: int,
) -> None:
    from tqdm import tqdm

    judge = None
    if cfg.run.judge:
        from r3rag.rewards.judge.client import JudgeClient

        judge = JudgeClient(cfg.judge)
    correct = sum(float(r["scores"]["cover_em"]) for r in previous)
    count = len(previous)
    size = cfg.run.batch_size
    bar = tqdm(total=total, initial=count, desc=f"{method.name}", unit="q", disable=not cfg.run.progress)
    try:
        with RowWriter(pred_path) as writer:
            for start in range(0, len(todo), size):
                chunk = todo[start:start + size]
                trajs = await method.arun([q for _, q in chunk])
                rows = [prediction_row(p, q, t, cfg.run.normalization) for (p, q), t in zip(chunk, trajs)]
                if judge is not None:
                    await _judge(judge, rows)
                for row in rows:
                    writer.write(row)
                    correct += float(row["scores"]["cover_em"])
                    count += 1
                bar.update(len(rows))
                bar.set_postfix(cover_em=f"{100 * correct / max(count, 1):.1f}")
    finally:
        bar.close()
        await method.aclose()


async def _judge(judge: Any, rows: list[dict[str, Any]]) -> None:
    """Set ``row["judge"]`` (1.0/0.0; ``None`` when the judge failed); no answer is 0 without a call."""
    asked = [r for r in rows if r["prediction"]]
    reqs = [judge.correctness_request(r["question"], r["prediction"], r["golden_answers"]) for r in asked]
    results = await judge.ajudge(reqs) if reqs else []
    for r in rows:
        r["judge"] = 0.0
    for r, res in zip(asked, results):
        r["judge"] = res.value

"""Re-score any JSONL of predictions (ours or another system's) with the QA metrics.

Each line needs a prediction field and a gold field (a string or a list of aliases). Field
names are detected from common conventions unless given: predictions from ``prediction``,
``pred``, ``pred_ans`` or ``pred_answer``; golds from ``golden_answers``, ``answer`` or ``answers``.
An optional ``judge_field`` (e.g. R1-Searcher's ``gpt4o_output``) adds ``judge_acc``, the share of
lines whose judge verdict is true. A line whose ``stop_reason`` says a service failed
(``retrieval_failed``, ``backend_error``: rows of runs made before such questions were kept apart)
is refused: it is not a prediction.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from r3rag.errors import DataError
from r3rag.metrics import METRIC_NAMES, get_normalizer, mean_percent, qa_scores
from r3rag.rollout.trajectory import INFRA_FAILURES

PREDICTION_FIELDS = ("prediction", "pred", "pred_ans", "pred_answer")
ANSWER_FIELDS = ("golden_answers", "answer", "answers")


def _pick(obj: dict[str, Any], given: str | None, candidates: tuple[str, ...], what: str, where: str) -> str:
    if given is not None:
        if given not in obj:
            raise DataError(f"{where}: no field {given!r} (fields: {', '.join(sorted(obj))})")
        return given
    for c in candidates:
        if c in obj:
            return c
    raise DataError(f"{where}: no {what} field; tried {', '.join(candidates)} (fields: {', '.join(sorted(obj))}); pass --{what}-field")


def _golds(value: Any, where: str) -> list[str]:
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, (str, int, float)):
        return [str(value)]
    if isinstance(value, list) and value and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise DataError(f"{where}: gold answer must be a string or a non-empty list of strings, got {value!r}")


def _truthy(value: Any) -> float:
    if isinstance(value, str):
        return float(value.strip().lower() in ("true", "yes", "1", "correct"))
    return float(bool(value))


def score_file(
    path: str | Path,
    prediction_field: str | None = None,
    answer_field: str | None = None,
    normalization: str = "squad",
    judge_field: str | None = None,
) -> dict[str, Any]:
    """Score a predictions JSONL; returns ``{"n", "em", "f1", "cover_em", "acc"[, "judge_acc"]}`` in percent."""
    try:
        get_normalizer(normalization)
    except ValueError as err:
        raise DataError(str(err)) from None
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    per_metric: dict[str, list[float]] = {m: [] for m in METRIC_NAMES}
    judged: list[float] = []
    with path.open(encoding="utf-8", errors="strict") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object")
            if obj.get("stop_reason") in INFRA_FAILURES:  # an old run's row: a dead service, not a prediction
                raise DataError(f"{where}: stop_reason {obj['stop_reason']!r} is a service's failure, not a prediction; "
                                "rerun that evaluation (benchmark/evaluate.py run, same --out) to retry it")
            pf = _pick(obj, prediction_field, PREDICTION_FIELDS, "prediction", where)
            af = _pick(obj, answer_field, ANSWER_FIELDS, "answer", where)
            pred = obj[pf]
            pred = "" if pred is None else str(pred)
            scores = qa_scores(pred, _golds(obj[af], where), normalization)
            for m in METRIC_NAMES:
                per_metric[m].append(scores[m])
            if judge_field is not None:
                if judge_field not in obj:
                    raise DataError(f"{where}: no field {judge_field!r}")
                judged.append(_truthy(obj[judge_field]))
    n = len(per_metric["em"])
    if n == 0:
        raise DataError(f"{path}: no predictions (the file is empty)")
    out: dict[str, Any] = {"n": n, **{m: mean_percent(v) for m, v in per_metric.items()}}
    if judge_field is not None:
        out["judge_acc"] = mean_percent(judged)
    out["normalization"] = normalization
    return out

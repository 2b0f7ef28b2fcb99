"""Every metric of a run, from its prediction rows (one per question, in dataset order).

A prediction row (written by :mod:`r3rag.evaluation.predictions`) carries the per-question
scores, so the metrics below are plain means over rows, in percent, rounded to 0.1:

``em``, ``f1``, ``cover_em``, ``acc``
    the rule metrics of :mod:`r3rag.metrics` (cover-EM is R1-Searcher's ACC_R, ``acc`` FlashRAG's
    substring accuracy); a question without an answer scores 0 on each.
``judge_acc``, ``rule_or_judge_acc`` (when the run asked a judge)
    the judge's verdict (R1-Searcher's ACC_L), and R3-RAG's ACC: correct when cover-EM holds,
    else when the judge says so.
``accuracy_by_steps``
    for k = 1..K (K the most steps any trajectory took): the score a question would get if its
    trajectory had been cut after k steps, i.e. its score when it answered within its first k
    steps and 0 otherwise. A trajectory answers at most once, at its last step, so each curve is
    non-decreasing in k and ends at the overall metric.
``ci95``
    percentile bootstrap: ``bootstrap`` resamples of the rows with replacement (one shared set of
    resample indices for all metrics, drawn from ``numpy.random.default_rng(seed)``), the 2.5th
    and 97.5th percentiles of each resampled mean.

A row that records an infrastructure failure (a dead retriever, model server or judge:
:mod:`r3rag.evaluation.failures`) is not a prediction: it is left out of every number and
counted apart under ``failed`` (kind -> rows); ``n`` counts the scored rows.

Averages of retrievals, generated tokens and steps per question, the share of each stop
reason, a retrievals histogram, and per-hop-count and per-type breakdowns (from the question's
``metadata.hops`` / ``metadata.type`` when the dataset has them) complete the result.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

import numpy as np

from r3rag.evaluation.failures import counts, split_failed
from r3rag.metrics import METRIC_NAMES
from r3rag.rollout.trajectory import STOP_REASONS

JUDGE_METRICS = ("judge_acc", "rule_or_judge_acc")


def _pct(x: float) -> float:
    return round(100.0 * float(x), 1)


def metric_columns(rows: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-row values of every headline metric, 0-1 (judge metrics only when judged)."""
    cols = {m: np.array([float(r["scores"][m]) for r in rows], dtype=np.float64) for m in METRIC_NAMES}
    if rows and all("judge" in r for r in rows):
        judge = np.array([float(r["judge"] or 0.0) for r in rows], dtype=np.float64)
        cols["judge_acc"] = judge
        cols["rule_or_judge_acc"] = np.maximum(cols["cover_em"], judge)
    return cols


def bootstrap_ci(cols: dict[str, np.ndarray], resamples: int, seed: int) -> dict[str, list[float]]:
    """95% percentile-bootstrap intervals (percent) of each column's mean."""
    n = len(next(iter(cols.values()))) if cols else 0
    if resamples <= 0 or n == 0:
        return {}
    idx = np.random.default_rng(seed).integers(0, n, size=(resamples, n))
    out = {}
    for name, values in cols.items():
        means = values[idx].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        out[name] = [_pct(lo), _pct(hi)]
    return out


def accuracy_by_steps(rows: Sequence[dict[str, Any]]) -> dict[str, list[float]]:
    """``{"k": [1..K], metric: [score if cut after k steps, ...]}`` for the rule metrics."""
    if not rows:
        return {"k": []}
    k_max = max(1, max(int(r["num_steps"]) for r in rows))
    out: dict[str, list[float]] = {"k": list(range(1, k_max + 1))}
    for m in METRIC_NAMES:
        curve = []
        for k in range(1, k_max + 1):
            total = sum(float(r["scores"][m]) for r in rows if r["answer_step"] is not None and r["answer_step"] <= k)
            curve.append(_pct(total / len(rows)))
        out[m] = curve
    return out


def _means(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    cols = metric_columns(rows)
    return {m: _pct(v.mean()) if len(v) else 0.0 for m, v in cols.items()}


def breakdown(rows: Sequence[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    """Metrics per value of ``metadata[key]`` (rows without it are left out)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        value = (r.get("metadata") or {}).get(key)
        if value is not None:
            groups.setdefault(str(value), []).append(r)

    def order(k: str) -> tuple[int, Any]:
        return (0, int(k)) if k.isdigit() else (1, k)

    return {k: {"n": len(groups[k]), **_means(groups[k])} for k in sorted(groups, key=order)}


def aggregate(rows: Sequence[dict[str, Any]], bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """All metrics of a run. ``rows`` must be in dataset order (the bootstrap depends on it)."""
    rows, failed = split_failed(sorted(rows, key=lambda r: r["index"]))
    apart = {"failed": counts(failed)} if failed else {}
    n = len(rows)
    if n == 0:
        return {"n": 0, "metrics": {}, **apart}
    cols = metric_columns(rows)
    stops = Counter(r["stop_reason"] or "none" for r in rows)
    retrievals = Counter(int(r["num_retrievals"]) for r in rows)
    return {
        "n": n,
        "metrics": {m: _pct(v.mean()) for m, v in cols.items()},
        "ci95": bootstrap_ci(cols, bootstrap, seed),
        "answered": _pct(sum(r["answer_step"] is not None for r in rows) / n),
        "avg_retrievals": round(sum(r["num_retrievals"] for r in rows) / n, 3),
        "avg_generated_tokens": round(sum(r["generated_tokens"] for r in rows) / n, 1),
        "avg_steps": round(sum(r["num_steps"] for r in rows) / n, 3),
        "stop_reasons": {s: _pct(stops[s] / n) for s in (*STOP_REASONS, "none") if stops.get(s)},
        "retrievals_histogram": {str(k): retrievals[k] for k in sorted(retrievals)},
        "accuracy_by_steps": accuracy_by_steps(rows),
        "by_hops": breakdown(rows, "hops"),
        "by_type": breakdown(rows, "type"),
        **apart,
    }

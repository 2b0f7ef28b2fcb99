"""Intervals for a run's per-question columns, and paired differences between two runs.

Two runs evaluated on the same questions are compared question by question: for each question
``q`` the difference ``d_q = score_B(q) - score_A(q)``; the estimate is the mean of ``d``, and
its 95% interval is the percentile bootstrap of that mean (resampling *questions*, so both runs'
scores of a question stay together). Pairing removes the between-question variance that two
independent intervals would both carry: two models at 20 +- 4 EM can differ by 5 +- 2.

Columns (per question):

``em``, ``f1``, ``cover_em``   the rule metrics of the prediction row, in percent;
``retrievals``                 retrieval calls the trajectory made (a count, not a percent);
``format_error``               100 when the trajectory ended in a format error, else 0.

>>> rows_a = [{"id": str(i), "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0}, "num_retrievals": 1,
...            "stop_reason": "answered"} for i in range(50)]
>>> rows_b = [dict(r, scores={"em": 1.0, "f1": 1.0, "cover_em": 1.0}) for r in rows_a]
>>> d = paired_differences(rows_a, rows_b, resamples=200)
>>> d["em"]["diff"], d["em"]["ci95"], d["em"]["excludes_zero"]
(100.0, [100.0, 100.0], True)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from r3rag.errors import DataError

#: column -> (how to read it from a prediction row, scale to report it in)
COLUMNS: dict[str, tuple[Any, float]] = {
    "em": (lambda r: float(r["scores"]["em"]), 100.0),
    "f1": (lambda r: float(r["scores"]["f1"]), 100.0),
    "cover_em": (lambda r: float(r["scores"]["cover_em"]), 100.0),
    "retrievals": (lambda r: float(r.get("num_retrievals") or 0), 1.0),
    "format_error": (lambda r: 1.0 if r.get("stop_reason") == "format_error" else 0.0, 100.0),
}


def columns(rows: Sequence[dict[str, Any]], names: Sequence[str] = tuple(COLUMNS)) -> dict[str, np.ndarray]:
    """Per-row values of each named column, already in report units."""
    out = {}
    for name in names:
        read, scale = COLUMNS[name]
        out[name] = np.array([read(r) * scale for r in rows], dtype=np.float64)
    return out


def _resample_idx(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _ci(values: np.ndarray, idx: np.ndarray) -> list[float]:
    means = values[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)]


def means_with_ci(rows: Sequence[dict[str, Any]], resamples: int = 1000, seed: int = 0,
                  names: Sequence[str] = tuple(COLUMNS)) -> dict[str, dict[str, Any]]:
    """``{column: {"mean", "ci95": [lo, hi]}}`` over ``rows`` (percentile bootstrap)."""
    if not rows:
        return {}
    cols = columns(rows, names)
    idx = _resample_idx(len(rows), resamples, seed)
    return {k: {"mean": round(float(v.mean()), 3), "ci95": _ci(v, idx)} for k, v in cols.items()}


def align(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The rows of both runs for the questions both answered, in A's order (matched by ``id``)."""
    by_id = {str(r["id"]): r for r in rows_b}
    pairs = [(r, by_id[str(r["id"])]) for r in rows_a if str(r["id"]) in by_id]
    if not pairs:
        raise DataError("paired comparison: the two runs share no question ids")
    return [a for a, _ in pairs], [b for _, b in pairs]


def paired_differences(rows_a: Sequence[dict[str, Any]], rows_b: Sequence[dict[str, Any]], resamples: int = 1000,
                       seed: int = 0, names: Sequence[str] = tuple(COLUMNS)) -> dict[str, dict[str, Any]]:
    """B minus A per column: ``{"diff", "ci95", "excludes_zero", "n"}`` on the shared questions."""
    a, b = align(rows_a, rows_b)
    ca, cb = columns(a, names), columns(b, names)
    idx = _resample_idx(len(a), resamples, seed)
    out = {}
    for k in names:
        d = cb[k] - ca[k]
        lo, hi = _ci(d, idx)
        out[k] = {"diff": round(float(d.mean()), 3), "ci95": [lo, hi], "excludes_zero": bool(lo > 0 or hi < 0),
                  "n": len(d)}
    return out

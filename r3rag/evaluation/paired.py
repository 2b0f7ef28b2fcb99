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
    return {k: paired_values(ca[k], cb[k], resamples, seed) for k in names}


def paired_values(values_a: Sequence[float], values_b: Sequence[float], resamples: int = 1000,
                  seed: int = 0) -> dict[str, Any]:
    """B minus A for any per-question values already aligned question by question (a column that
    :data:`COLUMNS` does not have): ``{"diff", "ci95", "excludes_zero", "n"}``, the same bootstrap
    (the same resampled questions for a given ``seed`` and count) as :func:`paired_differences`.

    >>> paired_values([0, 0, 1, 0], [1, 1, 1, 0], resamples=200)["diff"]
    0.5
    """
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or not len(a):
        raise DataError(f"paired values: two equally long non-empty lists needed, got {a.shape} and {b.shape}")
    d = b - a
    lo, hi = _ci(d, _resample_idx(len(d), resamples, seed))
    return {"diff": round(float(d.mean()), 3), "ci95": [lo, hi], "excludes_zero": bool(lo > 0 or hi < 0), "n": len(d)}


def select_rows(rows: Sequence[dict[str, Any]], spec: str | None) -> list[dict[str, Any]]:
    """The rows whose ``index`` (the question's position in its split) lies in ``spec``, ``"START:END"``
    with either end optional (``"300:"``: from the 301st question on; END excluded, as in Python).

    It compares two runs on a slice of their questions, e.g. the questions beyond the first 300
    that were consulted while choosing a recipe.

    >>> rows = [{"id": str(i), "index": i} for i in range(5)]
    >>> [r["index"] for r in select_rows(rows, "3:")], [r["index"] for r in select_rows(rows, ":2")]
    ([3, 4], [0, 1])
    """
    if not spec:
        return list(rows)
    start_s, sep, end_s = spec.partition(":")
    try:
        if not sep:
            raise ValueError
        start = int(start_s) if start_s.strip() else 0
        end = int(end_s) if end_s.strip() else None
    except ValueError:
        raise DataError(f"--rows {spec!r}: expected START:END with integers, either one optional (e.g. 300: or 0:300)") from None
    out = []
    for r in rows:
        if not isinstance(r.get("index"), int):
            raise DataError(f"--rows: prediction {r.get('id')!r} has no integer 'index' (its position in the split)")
        if r["index"] >= start and (end is None or r["index"] < end):
            out.append(r)
    if not out:
        raise DataError(f"--rows {spec!r}: no prediction has an index in that range")
    return out


def run_rows(path: str) -> list[dict[str, Any]]:
    """Prediction rows of a run folder (its ``predictions.jsonl``) or of a predictions file."""
    from pathlib import Path

    from r3rag.evaluation.predictions import load_rows

    p = Path(path)
    file = p / "predictions.jsonl" if p.is_dir() else p
    if not file.is_file():
        raise DataError(f"{path}: no predictions.jsonl there (a finished evaluation run folder or its predictions file)")
    from r3rag.evaluation.failures import FAILURES, counts, split_failed

    rows, failed = split_failed(load_rows(file, repair=False))
    failed += load_rows(file.parent / FAILURES, repair=False)
    if failed:  # compared on the questions both answered, the failed ones would silently drop out
        kinds = ", ".join(f"{k} {v}" for k, v in counts(failed).items())
        raise DataError(f"{file.parent}: {len(failed)} questions not evaluated because a service failed ({kinds}); "
                        "rerun that evaluation to retry them first")
    if not rows:
        raise DataError(f"{file}: no prediction rows")
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m r3rag.evaluation.paired RUN_A RUN_B``: B - A on the questions both answered."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="python -m r3rag.evaluation.paired",
                                 description="Paired differences B - A of two evaluation runs on the questions both "
                                 "answered (matched by id), each with its percentile-bootstrap 95%% interval.")
    ap.add_argument("run_a", help="run folder (or predictions.jsonl) of A, the reference")
    ap.add_argument("run_b", help="run folder (or predictions.jsonl) of B")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the differences as JSON instead of a table")
    ap.add_argument("--rows", default=None, metavar="START:END",
                    help="only the questions at these positions of the split, END excluded, either end optional "
                    "(e.g. 300: for those after the first 300); default: all shared questions")
    a = ap.parse_args(argv)
    try:
        rows_a, rows_b = select_rows(run_rows(a.run_a), a.rows), select_rows(run_rows(a.run_b), a.rows)
        d = paired_differences(rows_a, rows_b, a.resamples, a.seed)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    shared_a, shared_b = align(rows_a, rows_b)
    mean_a, mean_b = means_with_ci(shared_a, a.resamples, a.seed), means_with_ci(shared_b, a.resamples, a.seed)
    n = next(iter(d.values()))["n"]
    print(f"B - A on {n} shared questions ({a.resamples} bootstrap resamples; * = the interval excludes 0)")
    print("| column | A | B | B - A (paired) |")
    print("|---|---|---|---|")
    for k, v in d.items():
        star = " *" if v["excludes_zero"] else ""
        print(f"| {k} | {mean_a[k]['mean']:.2f} | {mean_b[k]['mean']:.2f} | {v['diff']:+.2f} [{v['ci95'][0]:+.2f}, {v['ci95'][1]:+.2f}]{star} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

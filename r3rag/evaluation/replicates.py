"""B - A when B is several training runs of one recipe (replicates), all evaluated on A's questions.

A paired interval between two evaluation runs (:mod:`r3rag.evaluation.paired`) covers the
*questions*: another draw of 300 questions would move the difference by about that much. It says
nothing about the *training run*: on this project's world, two RL runs of one recipe from one SFT
checkpoint, differing only in ``train.seed``, scored -3.7 and +0.3 EM against their start on the
same 300 questions (docs/rl.md). A claim about a recipe has to cover both sources of chance.

Here every replicate ``r`` of B is paired with A question by question, ``D[r, q] = B_r(q) - A(q)``
(a ``runs x questions`` matrix over the questions every run answered). The estimate is the mean of
``D``. Its 95% interval is a bootstrap that resamples both factors at once, independently: each
resample draws ``K`` runs with replacement *and* ``n`` questions with replacement and takes the
mean of ``D`` over the drawn rows and columns (the "pigeonhole" bootstrap for a crossed design,
Owen 2007; mildly conservative). With one replicate it is the ordinary paired bootstrap; with two
or three it widens the interval by the spread between the runs, which is the point. Three runs
are few for the run level, so the table also lists every replicate's own difference and the
standard deviation between them.

>>> a = [{"id": str(i), "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0}} for i in range(40)]
>>> b1 = [dict(r, scores={"em": 1.0 if i < 10 else 0.0, "f1": 0.0, "cover_em": 0.0}) for i, r in enumerate(a)]
>>> b2 = [dict(r, scores={"em": 1.0 if i < 2 else 0.0, "f1": 0.0, "cover_em": 0.0}) for i, r in enumerate(a)]
>>> d = replicate_differences(a, [b1, b2], names=("em",), resamples=500)
>>> d["em"]["diff"], d["em"]["per_run"], d["em"]["between_runs_sd"]
(15.0, [25.0, 5.0], 14.142)
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from r3rag.errors import DataError
from r3rag.evaluation.paired import COLUMNS, columns


def shared_ids(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Question ids that A and every replicate answered, in A's order."""
    common = {str(r["id"]) for r in rows_a}
    for rows in runs_b:
        common &= {str(r["id"]) for r in rows}
    ids = [str(r["id"]) for r in rows_a if str(r["id"]) in common]
    if not ids:
        raise DataError("replicates: A and the B runs share no question ids")
    return ids


def difference_matrix(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]],
                      names: Sequence[str] = tuple(COLUMNS)) -> dict[str, np.ndarray]:
    """``{column: D}`` with ``D[r, q] = B_r(q) - A(q)`` in report units; shape ``(runs, questions)``."""
    if not runs_b:
        raise DataError("replicates: no B run given")
    ids = shared_ids(rows_a, runs_b)
    by_a = {str(r["id"]): r for r in rows_a}
    ca = columns([by_a[i] for i in ids], names)  # column -> (n,)
    cb = []
    for rows in runs_b:
        by_b = {str(r["id"]): r for r in rows}
        cb.append(columns([by_b[i] for i in ids], names))  # column -> (n,), one per run
    return {k: np.stack([c[k] - ca[k] for c in cb]) for k in names}  # column -> (runs, n)


def crossed_bootstrap(d: np.ndarray, resamples: int = 1000, seed: int = 0) -> list[float]:
    """95% percentile interval of ``d.mean()`` resampling rows (runs) and columns (questions) independently."""
    runs, n = d.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        r = rng.integers(0, runs, size=runs)  # (runs,)
        q = rng.integers(0, n, size=n)  # (n,)
        means[i] = d[np.ix_(r, q)].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)]


def replicate_differences(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]],
                          names: Sequence[str] = tuple(COLUMNS), resamples: int = 1000,
                          seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per column: ``diff`` (mean over runs and questions), ``ci95`` (both factors resampled),
    ``excludes_zero``, ``per_run`` (each replicate's own mean difference), ``between_runs_sd``
    (sample standard deviation of ``per_run``; 0 for one run), ``runs``, ``n``."""
    out = {}
    for k, d in difference_matrix(rows_a, runs_b, names).items():
        lo, hi = crossed_bootstrap(d, resamples, seed)
        per_run = d.mean(axis=1)  # (runs,)
        sd = float(per_run.std(ddof=1)) if len(per_run) > 1 else 0.0
        out[k] = {"diff": round(float(d.mean()), 3), "ci95": [lo, hi], "excludes_zero": bool(lo > 0 or hi < 0),
                  "per_run": [round(float(x), 3) for x in per_run], "between_runs_sd": round(sd, 3),
                  "runs": int(d.shape[0]), "n": int(d.shape[1])}
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m r3rag.evaluation.replicates RUN_A RUN_B1 RUN_B2 ...``"""
    import argparse
    import json
    import sys

    from r3rag.evaluation.paired import run_rows, select_rows

    ap = argparse.ArgumentParser(
        prog="python -m r3rag.evaluation.replicates",
        description="B - A where B is several training runs of one recipe (e.g. train.seed 0, 1, 2 from A's "
        "checkpoint), all evaluated on A's questions. The 95%% interval resamples the runs and the questions, so it "
        "covers the training run's chance as well as the questions'; each run's own difference is listed too.")
    ap.add_argument("run_a", help="run folder (or predictions.jsonl) of A, the reference (e.g. the SFT checkpoint's)")
    ap.add_argument("runs_b", nargs="+", help="run folders (or predictions.jsonl) of B's replicates")
    ap.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: %(default)s)")
    ap.add_argument("--rows", default=None, metavar="START:END",
                    help="only the questions at these positions of the split, END excluded (as paired's --rows)")
    ap.add_argument("--json", action="store_true", help="print the differences as JSON instead of a table")
    a = ap.parse_args(argv)
    if a.resamples < 1:
        print("error: --resamples must be at least 1", file=sys.stderr)
        return 2
    try:
        rows_a = select_rows(run_rows(a.run_a), a.rows)
        runs_b = [select_rows(run_rows(p), a.rows) for p in a.runs_b]
        d = replicate_differences(rows_a, runs_b, resamples=a.resamples, seed=a.seed)
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(d, indent=2))
        return 0
    first = next(iter(d.values()))
    print(f"B - A over {first['runs']} run(s) of B on {first['n']} questions every run answered "
          f"({a.resamples} resamples of runs and questions; * = the interval excludes 0)")
    print("| column | B - A (runs and questions resampled) | each run | sd between runs |")
    print("|---|---|---|---|")
    for k, v in d.items():
        star = " *" if v["excludes_zero"] else ""
        each = ", ".join(f"{x:+.2f}" for x in v["per_run"])
        print(f"| {k} | {v['diff']:+.2f} [{v['ci95'][0]:+.2f}, {v['ci95'][1]:+.2f}]{star} | {each} | {v['between_runs_sd']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

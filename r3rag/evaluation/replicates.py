"""B - A when B is several training runs of one recipe (replicates), all evaluated on A's questions.

A paired interval between two evaluation runs (:mod:`r3rag.evaluation.paired`) covers the
*questions*: another draw of 300 questions would move the difference by about that much. It says
nothing about the *training run*: on this project's world, two RL runs of one recipe from one SFT
checkpoint, differing only in ``train.seed``, scored -3.7 and +0.3 EM against their start on the
same 300 questions (docs/results/rl.md). A claim about a recipe has to cover both sources of chance.

Here every replicate ``r`` of B is paired with A question by question, ``D[r, q] = B_r(q) - A(q)``
(a ``runs x questions`` matrix over the questions every run answered). The estimate is the mean of
``D``. Its 95% interval is a bootstrap that resamples both factors at once, independently: each
resample draws ``K`` runs with replacement *and* ``n`` questions with replacement and takes the
mean of ``D`` over the drawn rows and columns (the "pigeonhole" bootstrap for a crossed design,
Owen 2007; mildly conservative). With one replicate it is the ordinary paired bootstrap; with two
or three it widens the interval by the spread between the runs, which is the point. Three runs
are few for the run level, so the table also lists every replicate's own difference and the
standard deviation between them.

**Against a null control** (``--control C1 C2 ...``): replicates of a change that should carry no
signal, e.g. copies of each RL update with random signs (``python -m r3rag.train.rl.update_noise
random-sign``), also evaluated on A's questions. Any change to a greedy student moves some close
calls; on this world a random update of the RL update's size cost SFT -2.6 EM. ``B - C`` is then
what the training did beyond that: ``mean_r B_r(q) - mean_c C_c(q)`` averaged over the questions,
its interval from resampling B's runs, C's runs and the questions (one draw, shared by both),
independently.

>>> a = [{"id": str(i), "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0}} for i in range(40)]
>>> b1 = [dict(r, scores={"em": 1.0 if i < 10 else 0.0, "f1": 0.0, "cover_em": 0.0}) for i, r in enumerate(a)]
>>> b2 = [dict(r, scores={"em": 1.0 if i < 2 else 0.0, "f1": 0.0, "cover_em": 0.0}) for i, r in enumerate(a)]
>>> d = replicate_differences(a, [b1, b2], names=("em",), resamples=500)
>>> d["em"]["diff"], d["em"]["per_run"], d["em"]["between_runs_sd"]
(15.0, [25.0, 5.0], 14.142)
>>> c = [dict(r, scores={"em": 1.0 if i < 4 else 0.0, "f1": 0.0, "cover_em": 0.0}) for i, r in enumerate(a)]
>>> v = control_differences(a, [b1, b2], [c, c], names=("em",), resamples=500)["em"]
>>> v["diff"], v["per_run"], v["control_per_run"]
(5.0, [25.0, 5.0], [10.0, 10.0])
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from r3rag.errors import DataError
from r3rag.evaluation.paired import COLUMNS, columns


def shared_ids(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Question ids that A and every replicate (and control run) answered, in A's order."""
    common = {str(r["id"]) for r in rows_a}
    for rows in runs_b:
        common &= {str(r["id"]) for r in rows}
    ids = [str(r["id"]) for r in rows_a if str(r["id"]) in common]
    if not ids:
        raise DataError("replicates: A and the B runs share no question ids")
    return ids


def difference_matrix(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]],
                      names: Sequence[str] = tuple(COLUMNS), ids: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """``{column: D}`` with ``D[r, q] = B_r(q) - A(q)`` in report units; shape ``(runs, questions)``,
    over ``ids`` (default: the questions A and every B run answered)."""
    if not runs_b:
        raise DataError("replicates: no B run given")
    ids = shared_ids(rows_a, runs_b) if ids is None else list(ids)
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


def crossed_bootstrap_two(db: np.ndarray, dc: np.ndarray, resamples: int = 1000, seed: int = 0) -> list[float]:
    """95% percentile interval of ``db.mean() - dc.mean()``: B's runs, C's runs and the questions
    (one draw for both, the columns are the same questions) resampled independently."""
    if db.shape[1] != dc.shape[1]:
        raise DataError(f"replicates: B and the control cover {db.shape[1]} and {dc.shape[1]} questions")
    (kb, n), kc = db.shape, dc.shape[0]
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        rb = rng.integers(0, kb, size=kb)  # (kb,)
        rc = rng.integers(0, kc, size=kc)  # (kc,)
        q = rng.integers(0, n, size=n)  # (n,)
        means[i] = db[np.ix_(rb, q)].mean() - dc[np.ix_(rc, q)].mean()
    lo, hi = np.percentile(means, [2.5, 97.5])
    return [round(float(lo), 3), round(float(hi), 3)]


def _sd(x: np.ndarray) -> float:
    return float(x.std(ddof=1)) if len(x) > 1 else 0.0


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
        out[k] = {"diff": round(float(d.mean()), 3), "ci95": [lo, hi], "excludes_zero": bool(lo > 0 or hi < 0),
                  "per_run": [round(float(x), 3) for x in per_run], "between_runs_sd": round(_sd(per_run), 3),
                  "runs": int(d.shape[0]), "n": int(d.shape[1])}
    return out


def control_differences(rows_a: Sequence[dict[str, Any]], runs_b: Sequence[Sequence[dict[str, Any]]],
                        runs_c: Sequence[Sequence[dict[str, Any]]], names: Sequence[str] = tuple(COLUMNS),
                        resamples: int = 1000, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Per column, B's replicates against the control's on the questions A, every B run and every
    control run answered: ``diff`` (mean of B - mean of C), ``ci95`` (B's runs, C's runs and the
    questions resampled), ``excludes_zero``, ``per_run`` and ``control_per_run`` (each run against
    A), ``runs``, ``control_runs``, ``n``."""
    if not runs_c:
        raise DataError("replicates: no control run given")
    ids = shared_ids(rows_a, [*runs_b, *runs_c])
    mb = difference_matrix(rows_a, runs_b, names, ids)  # column -> (runs_b, n)
    mc = difference_matrix(rows_a, runs_c, names, ids)  # column -> (runs_c, n)
    out = {}
    for k in names:
        db, dc = mb[k], mc[k]
        lo, hi = crossed_bootstrap_two(db, dc, resamples, seed)
        out[k] = {"diff": round(float(db.mean() - dc.mean()), 3), "ci95": [lo, hi],
                  "excludes_zero": bool(lo > 0 or hi < 0),
                  "per_run": [round(float(x), 3) for x in db.mean(axis=1)],
                  "control_per_run": [round(float(x), 3) for x in dc.mean(axis=1)],
                  "runs": int(db.shape[0]), "control_runs": int(dc.shape[0]), "n": int(db.shape[1])}
    return out


def _interval(v: dict[str, Any]) -> str:
    return f"{v['diff']:+.2f} [{v['ci95'][0]:+.2f}, {v['ci95'][1]:+.2f}]" + (" *" if v["excludes_zero"] else "")


def _each(xs: Sequence[float]) -> str:
    return ", ".join(f"{x:+.2f}" for x in xs)


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
    ap.add_argument("--control", nargs="+", default=None, metavar="RUN",
                    help="run folders of a null control's replicates (e.g. random-sign copies of each update, "
                    "python -m r3rag.train.rl.update_noise random-sign): also prints B - control, the three "
                    "factors (B's runs, the control's runs, the questions) resampled")
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
        runs_c = [select_rows(run_rows(p), a.rows) for p in a.control or []]
        d = replicate_differences(rows_a, runs_b, resamples=a.resamples, seed=a.seed)
        dc = control_differences(rows_a, runs_b, runs_c, resamples=a.resamples, seed=a.seed) if runs_c else None
    except DataError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(d if dc is None else {"vs_a": d, "vs_control": dc}, indent=2))
        return 0
    first = next(iter(d.values()))
    print(f"B - A over {first['runs']} run(s) of B on {first['n']} questions every run answered "
          f"({a.resamples} resamples of runs and questions; * = the interval excludes 0)")
    print("| column | B - A (runs and questions resampled) | each run | sd between runs |")
    print("|---|---|---|---|")
    for k, v in d.items():
        print(f"| {k} | {_interval(v)} | {_each(v['per_run'])} | {v['between_runs_sd']:.2f} |")
    if dc is not None:
        first = next(iter(dc.values()))
        print()
        print(f"B - control: {first['runs']} run(s) of B against {first['control_runs']} control run(s) on the "
              f"{first['n']} questions all answered (B's runs, the control's runs and the questions resampled)")
        print("| column | B - control | B's runs - A | control's runs - A |")
        print("|---|---|---|---|")
        for k, v in dc.items():
            print(f"| {k} | {_interval(v)} | {_each(v['per_run'])} | {_each(v['control_per_run'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

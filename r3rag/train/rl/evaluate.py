"""Held-out evaluation inside a run, through the evaluation package's own row and metric code.

The policy being trained answers the held-out questions greedily (one sample each) through the
same rollout engine and format; each trajectory becomes a prediction row
(:func:`r3rag.evaluation.predictions.prediction_row`) and the rows are aggregated by
:func:`r3rag.evaluation.aggregate.aggregate`, exactly as ``benchmark/evaluate.py`` does. Rows are
kept in ``eval/step_NNNNNN.jsonl``, so two evaluations of one run (before and after training)
can be compared question by question: :func:`paired_difference` bootstraps the per-question
difference with :func:`r3rag.evaluation.aggregate.bootstrap_ci` (a paired 95% interval).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from r3rag.data.records import Question
from r3rag.evaluation.aggregate import aggregate, bootstrap_ci
from r3rag.evaluation.predictions import RowWriter, load_rows, prediction_row
from r3rag.rollout.engine import RolloutEngine


def eval_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / "eval" / f"step_{step:06d}.jsonl"


def evaluate_policy(engine: RolloutEngine, questions: Sequence[Question], path: Path, normalization: str = "squad",
                    batch_size: int = 32) -> list[dict[str, Any]]:
    """Answer ``questions`` (those not already in ``path``), append rows, return all rows."""
    rows = load_rows(path)
    done = {r["id"] for r in rows}
    todo = [(i, q) for i, q in enumerate(questions) if str(q.id) not in done]
    if todo:
        with RowWriter(path) as w:
            for s in range(0, len(todo), batch_size):
                chunk = todo[s:s + batch_size]
                trajs = asyncio.run(engine.arun([q for _, q in chunk], n_samples=1))
                for (i, q), t in zip(chunk, trajs):
                    w.write(prediction_row(i, q, t, normalization))
        rows = load_rows(path)
    return rows


def retrievals_by_hops(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    groups: dict[str, list[int]] = {}
    for r in rows:
        h = (r.get("metadata") or {}).get("hops")
        if h is not None:
            groups.setdefault(str(h), []).append(int(r["num_retrievals"]))
    return {k: round(sum(v) / len(v), 3) for k, v in sorted(groups.items())}


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Flat ``eval/*`` scalars for the metrics log."""
    res = aggregate(rows, bootstrap=0)
    out: dict[str, Any] = {f"eval/{k}": v for k, v in res.get("metrics", {}).items()}
    out["eval/avg_retrievals"] = res.get("avg_retrievals", 0.0)
    out["eval/answered"] = res.get("answered", 0.0)
    for h, v in retrievals_by_hops(rows).items():
        out[f"eval/retrievals_hops{h}"] = v
    for h, m in res.get("by_hops", {}).items():
        out[f"eval/em_hops{h}"] = m.get("em", 0.0)
    return out


def paired_difference(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], metric: str = "em",
                      resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``after - before`` on the questions both answered: the mean difference (points) and its
    paired percentile-bootstrap 95% interval."""
    a = {r["id"]: float(r["scores"][metric]) for r in before}
    b = {r["id"]: float(r["scores"][metric]) for r in after}
    ids = [i for i in a if i in b]
    diff = np.array([b[i] - a[i] for i in ids], dtype=np.float64)
    ci = bootstrap_ci({metric: diff}, resamples, seed).get(metric, [0.0, 0.0])
    return {"n": len(ids), "metric": metric, "before": round(100 * float(np.mean([a[i] for i in ids])), 1) if ids else 0.0,
            "after": round(100 * float(np.mean([b[i] for i in ids])), 1) if ids else 0.0,
            "diff": round(100 * float(diff.mean()), 1) if ids else 0.0, "ci95": ci}


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")

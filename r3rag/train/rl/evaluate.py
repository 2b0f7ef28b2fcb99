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
from r3rag.evaluation.failures import failure_of
from r3rag.evaluation.predictions import RowWriter, load_rows, prediction_row
from r3rag.rollout.engine import RolloutEngine


def eval_path(out_dir: str | Path, step: int) -> Path:
    return Path(out_dir) / "eval" / f"step_{step:06d}.jsonl"


def evaluate_policy(engine: RolloutEngine, questions: Sequence[Question], path: Path, normalization: str = "squad",
                    batch_size: int = 32, reward_fn: Any = None) -> list[dict[str, Any]]:
    """Answer ``questions`` (those not already in ``path``), append rows, return all rows. With
    ``reward_fn`` (the run's reward recipe) each row also gets ``reward``: the total the recipe
    gives its trajectory, as a training rollout's would be scored."""
    rows = load_rows(path)
    done = {r["id"] for r in rows}
    todo = [(i, q) for i, q in enumerate(questions) if str(q.id) not in done]
    if todo:
        with RowWriter(path) as w:
            for s in range(0, len(todo), batch_size):
                chunk = todo[s:s + batch_size]
                trajs = asyncio.run(engine.arun([q for _, q in chunk], n_samples=1))
                rewards = reward_fn(trajs) if reward_fn is not None else [None] * len(trajs)
                for (i, q), t, r in zip(chunk, trajs, rewards):
                    row = prediction_row(i, q, t, normalization)
                    if r is not None:
                        row["reward"] = float(r.total)
                    w.write(row)
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
    rewards = [float(r["reward"]) for r in rows if isinstance(r.get("reward"), (int, float))]
    if rewards:
        out["eval/reward"] = sum(rewards) / len(rewards)
    out["eval/answered"] = res.get("answered", 0.0)
    for h, v in retrievals_by_hops(rows).items():
        out[f"eval/retrievals_hops{h}"] = v
    for h, m in res.get("by_hops", {}).items():
        out[f"eval/em_hops{h}"] = m.get("em", 0.0)
    return out


def paired_difference(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], metric: str = "em",
                      resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """``after - before`` on the questions both answered: the mean difference (points) and its
    paired percentile-bootstrap 95% interval. A row a service failed for (:func:`failure_of`) is
    not an answer and is left out on both sides.

    >>> ok = lambda i, em: {"id": str(i), "scores": {"em": em}, "stop_reason": "answered"}
    >>> dead = {"id": "0", "scores": {"em": 0.0}, "stop_reason": "retrieval_failed"}
    >>> d = paired_difference([ok(0, 1.0), ok(1, 0.0)], [dead, ok(1, 1.0)], resamples=100)
    >>> d["n"], d["diff"]
    (1, 100.0)
    """
    a = {r["id"]: float(r["scores"][metric]) for r in before if failure_of(r) is None}
    b = {r["id"]: float(r["scores"][metric]) for r in after if failure_of(r) is None}
    ids = [i for i in a if i in b]
    diff = np.array([b[i] - a[i] for i in ids], dtype=np.float64)
    ci = bootstrap_ci({metric: diff}, resamples, seed).get(metric, [0.0, 0.0])
    return {"n": len(ids), "metric": metric, "before": round(100 * float(np.mean([a[i] for i in ids])), 1) if ids else 0.0,
            "after": round(100 * float(np.mean([b[i] for i in ids])), 1) if ids else 0.0,
            "diff": round(100 * float(diff.mean()), 1) if ids else 0.0, "ci95": ci}


def paired_reward(before: Sequence[dict[str, Any]], after: Sequence[dict[str, Any]], resamples: int = 2000,
                  seed: int = 0) -> dict[str, Any] | None:
    """``after - before`` of the rows' training ``reward`` on the questions both scored (the
    reward's own units, not points): means, difference and its paired bootstrap 95% interval;
    None when the rows carry no reward. Rows a service failed for are left out, as above.

    >>> b = [{"id": str(i), "reward": 0.0} for i in range(20)]
    >>> a = [{"id": str(i), "reward": 1.0 if i < 10 else 0.0} for i in range(20)]
    >>> d = paired_reward(b, a, resamples=200)
    >>> d["n"], d["before"], d["after"], d["diff"], d["ci95"][0] > 0
    (20, 0.0, 0.5, 0.5, True)
    """
    a = {r["id"]: float(r["reward"]) for r in before if isinstance(r.get("reward"), (int, float)) and failure_of(r) is None}
    b = {r["id"]: float(r["reward"]) for r in after if isinstance(r.get("reward"), (int, float)) and failure_of(r) is None}
    ids = [i for i in a if i in b]
    if not ids:
        return None
    diff = np.array([b[i] - a[i] for i in ids], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(ids), size=(max(1, resamples), len(ids)))  # (resamples, n)
    lo, hi = np.percentile(diff[idx].mean(axis=1), [2.5, 97.5])
    return {"n": len(ids), "before": round(float(np.mean([a[i] for i in ids])), 4),
            "after": round(float(np.mean([b[i] for i in ids])), 4), "diff": round(float(diff.mean()), 4),
            "ci95": [round(float(lo), 4), round(float(hi), 4)]}


def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")

"""Infrastructure failures of an evaluation run: questions a service, not the model, left unanswered.

Three kinds, named after what failed:

``retrieval_failed``
    the retriever failed for one of the question's queries after the client's own retries (a
    dead or overloaded service, a timeout, a malformed reply): the trajectory's stop reason;
``backend_error``
    the model backend failed (a dead OpenAI-compatible or vLLM server, a CUDA error, an
    out-of-memory): the trajectory's stop reason;
``judge_unavailable``
    with ``run.judge`` on, the LLM judge gave no verdict (down, timing out, unparseable reply).

Such a question is never a prediction. Its row goes to ``failures.jsonl`` beside
``predictions.jsonl`` (with ``failure``, the kind, and ``error``, what the service said), never
into the scores: the metrics cover the scored questions only, ``results.json`` counts the failed
ones apart (``failed``), and :func:`r3rag.evaluation.runner.run_evaluation` raises
:class:`EvaluationIncomplete` (one line naming each kind, how many, and the first error) once the
run's files are written. A rerun into the same folder retries exactly the questions without a
prediction: the failed ones and any a stopped run never reached. A question whose prediction
stands but whose judge verdict failed is judged again, not generated again.

``failures.jsonl`` is appended to as the run goes (so a killed run keeps its record) and rewritten
at the end of each run to hold exactly the questions still failing; a question listed there is
never in ``predictions.jsonl``. Prediction rows of older versions that carry an infrastructure
failure are moved there by the next run (see :func:`split_failed`).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterable

from r3rag.errors import R3RagError
from r3rag.rollout.trajectory import INFRA_FAILURES

FAILURES = "failures.jsonl"
JUDGE_UNAVAILABLE = "judge_unavailable"
#: every kind, in the order the summary names them
FAILURE_KINDS: tuple[str, ...] = ("retrieval_failed", "backend_error", JUDGE_UNAVAILABLE)
_ERROR_KEYS = {"retrieval_failed": "retrieval_error", "backend_error": "backend_error"}


class EvaluationIncomplete(R3RagError):
    """Some questions were not evaluated because a service failed; a rerun retries them.

    ``outcome`` is the run's :class:`~r3rag.evaluation.runner.RunOutcome` (``None`` when the
    failure was seen in shard processes). Commands exit with status 3 on it."""

    exit_code = 3

    def __init__(self, message: str, outcome: Any = None) -> None:
        super().__init__(message)
        self.outcome = outcome


def failure_of(row: dict[str, Any]) -> str | None:
    """The infrastructure failure a row records, or ``None`` when it is a prediction to score.

    >>> failure_of({"stop_reason": "retrieval_failed"}), failure_of({"stop_reason": "answered", "judge": None})
    ('retrieval_failed', 'judge_unavailable')
    >>> failure_of({"stop_reason": "format_error", "judge": 0.0}) is None
    True
    """
    stop = row.get("stop_reason")
    if stop in INFRA_FAILURES:
        return str(stop)
    if "judge" in row and row["judge"] is None:
        return JUDGE_UNAVAILABLE
    return None


def failure_error(row: dict[str, Any], kind: str) -> str:
    """What the failing service said, from the row (the trajectory's metadata or the judge's status)."""
    if kind == JUDGE_UNAVAILABLE:
        return str(row.get("judge_error") or "no verdict")
    meta = (row.get("trajectory") or {}).get("metadata") or {}
    return str(meta.get(_ERROR_KEYS.get(kind, ""), "") or "no reason given")


def failure_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row as it is kept in ``failures.jsonl``: ``failure`` and ``error`` added; a row whose
    trajectory the infrastructure ended loses its ``scores`` (they are not the model's)."""
    kind = failure_of(row)
    assert kind is not None, "failure_row of a row that did not fail"
    out = {**row, "failure": kind, "error": failure_error(row, kind)}
    if kind != JUDGE_UNAVAILABLE:
        out.pop("scores", None)
    return out


def split_failed(rows: Iterable[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(predictions, failed)``: rows written before failures were kept apart may hold both."""
    good: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for r in rows:
        (bad if failure_of(r) else good).append(r)
    return good, bad


def latest_by_id(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last row of each id (a run appends; a later attempt replaces an earlier one)."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        out[str(r["id"])] = r
    return out


def counts(failed: Iterable[dict[str, Any]]) -> dict[str, int]:
    """``{kind: how many}`` in :data:`FAILURE_KINDS` order (kinds with none left out)."""
    c = Counter(r.get("failure") or failure_of(r) for r in failed)
    return {k: c[k] for k in FAILURE_KINDS if c.get(k)}


def failure_line(failed: list[dict[str, Any]], not_attempted: int, n_questions: int | None, out_dir: str | Path,
                 stopped_early: bool = False) -> str:
    """One line: how many of the run's questions are not evaluated, each kind with its first error,
    and how to retry them."""
    parts = []
    for kind, n in counts(failed).items():
        first = next(r for r in failed if (r.get("failure") or failure_of(r)) == kind)
        err = " ".join(str(first.get("error") or failure_error(first, kind)).split())
        parts.append(f"{kind} {n} ({err[:160]}{'...' if len(err) > 160 else ''})")
    if not_attempted:
        why = " after the failures above" if stopped_early else ""
        parts.append(f"not attempted {not_attempted}{why}")
    missing = len(failed) + not_attempted
    of = f" of {n_questions}" if n_questions is not None else ""
    return (f"{out_dir}: {missing}{of} questions not evaluated because a service failed: "
            f"{'; '.join(parts)}. They are not scored; rerun the same command to retry exactly them")

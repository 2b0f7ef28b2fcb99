"""The predictions file of a run: one JSON object per question, appended as each one finishes.

A row holds the question's ``id`` and its position ``index`` in the (unsharded) dataset, the
prediction, its scores, the counts the aggregate needs, and the whole trajectory. Rows are
written with ``flush`` + ``os.fsync``, so after a crash or a SIGKILL the file holds every row that
was reported done, plus at most one partial last line. :func:`load_rows` drops that partial line
(truncating the file back to the last complete row), so a rerun appends after it and nothing is
lost or doubled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from r3rag.data.records import Question
from r3rag.errors import DataError
from r3rag.metrics import qa_scores
from r3rag.rollout.trajectory import Trajectory

PREDICTIONS = "predictions.jsonl"
#: question metadata copied into each row (the breakdowns read them)
KEPT_METADATA = ("hops", "type")


def prediction_row(index: int, question: Question, traj: Trajectory, normalization: str) -> dict[str, Any]:
    answer = traj.answer
    answer_step = None
    for i, step in enumerate(traj.steps):
        if step.answer is not None:
            answer_step = i + 1
    return {
        "id": str(question.id),
        "index": index,
        "question": question.question,
        "golden_answers": list(question.golden_answers),
        "prediction": answer or "",
        "scores": qa_scores(answer or "", question.golden_answers, normalization) if answer is not None
        else {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "acc": 0.0},
        "answer_step": answer_step,
        "num_steps": len(traj.steps),
        "num_retrievals": traj.num_retrievals,
        "generated_tokens": traj.num_generated_tokens,
        "stop_reason": traj.stop_reason,
        "metadata": {k: question.metadata[k] for k in KEPT_METADATA if question.metadata.get(k) is not None},
        "trajectory": traj.to_dict(),
    }


def load_rows(path: str | Path, repair: bool = True) -> list[dict[str, Any]]:
    """Rows of a predictions file. Text after the last newline (an interrupted write) is dropped,
    and with ``repair`` cut from the file; a bad complete line is an error naming file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    complete = data.rfind(b"\n") + 1  # bytes up to and including the last newline
    rows: list[dict[str, Any]] = []
    for lineno, raw in enumerate(data[:complete].split(b"\n")[:-1], 1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise DataError(f"{path}:{lineno}: not a valid prediction row (JSON)") from None
        if not isinstance(row, dict) or "id" not in row or "index" not in row:
            raise DataError(f"{path}:{lineno}: not a prediction row (needs 'id' and 'index')")
        rows.append(row)
    if repair and complete < len(data):
        with path.open("r+b") as fh:
            fh.truncate(complete)
    return rows


class RowWriter:
    """Append rows to a predictions file, each flushed and fsync'ed before :meth:`write` returns."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] = self.path.open("a", encoding="utf-8")

    def write(self, row: dict[str, Any]) -> None:
        self._fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "RowWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> None:
    """Write a whole predictions file at once (merge), replacing it atomically."""
    path = Path(path)
    tmp = path.with_suffix(".jsonl.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)

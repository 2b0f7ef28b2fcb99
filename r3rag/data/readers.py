"""Readers for the question and corpus files every stage consumes.

Formats understood (detected per line, so a file may not mix them):

``flashrag``    ``{"id", "question", "golden_answers": [str], "metadata"?: {...}}``
``r1searcher``  ``{"idx", "question", "answer": str | [str]}`` (R1-Searcher's eval and RL files)
corpus          ``{"id", "contents": "title\\ntext"}`` (FlashRAG corpus convention)
facts           ``{"subject", "subject_name", "relation", "object", "value", "passage_id"}`` (the
                embedded world's relation table, ``facts.jsonl``; ``object`` is null for literals)

Every problem is reported as ``file:line: what is wrong``; the readers stop at the first one
with :class:`r3rag.errors.DataError` (``data/validate.py`` lists them all), so a bad line
fails before any model is loaded, not deep inside a later stage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from r3rag.data.records import Passage, Question
from r3rag.errors import DataError

QUESTION_FORMATS = ("flashrag", "r1searcher")


# ---- record checks: each returns (record, None) or (None, problem) --------------------------
def _check_question(obj: Any) -> tuple[Question | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    if "golden_answers" in obj or "id" in obj:
        qid, answers, meta = obj.get("id"), obj.get("golden_answers"), obj.get("metadata", {})
        id_field, answer_field = "id", "golden_answers"
    elif "idx" in obj:
        qid, answers, meta = obj.get("idx"), obj.get("answer"), {}
        id_field, answer_field = "idx", "answer"
        extra = {k: v for k, v in obj.items() if k not in ("idx", "question", "answer", "gen_text_store")}
        meta = extra
    else:
        return None, "not a question record: expected 'id'+'golden_answers' (FlashRAG) or 'idx'+'answer' (R1-Searcher)"
    if qid is None or isinstance(qid, (dict, list, bool)) or str(qid) == "":
        return None, f"'{id_field}' must be a non-empty string or integer"
    question = obj.get("question")
    if not isinstance(question, str) or not question.strip():
        return None, "'question' must be a non-empty string"
    if isinstance(answers, (str, int, float)) and not isinstance(answers, bool):
        answers = [str(answers)]
    if isinstance(answers, bool):  # some releases store yes/no answers as JSON booleans
        answers = ["yes" if answers else "no"]
    if not isinstance(answers, list) or not answers:
        return None, f"'{answer_field}' must be a non-empty list of strings"
    if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in answers):
        return None, f"'{answer_field}' must contain only strings"
    answers = [str(a) for a in answers]
    if not any(a.strip() for a in answers):
        return None, f"'{answer_field}' has only empty answers"
    if not isinstance(meta, dict):
        return None, "'metadata' must be an object"
    return Question(id=str(qid), question=question, golden_answers=answers, metadata=meta), None


def _check_passage(obj: Any) -> tuple[Passage | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    pid, contents = obj.get("id"), obj.get("contents")
    if pid is None or isinstance(pid, (dict, list, bool)) or str(pid) == "":
        return None, "'id' must be a non-empty string or integer"
    if not isinstance(contents, str) or not contents.strip():
        return None, "'contents' must be a non-empty string ('title\\ntext')"
    return Passage(id=str(pid), contents=contents), None


@dataclass
class FactRecord:
    """One row of the world's relation table; ``id`` (subject:relation) is unique per file."""

    id: str
    passage_id: str


def _check_fact(obj: Any) -> tuple[FactRecord | None, str | None]:
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    for key in ("subject", "relation", "value", "passage_id"):
        v = obj.get(key)
        if not isinstance(v, str) or not v.strip():
            return None, f"'{key}' must be a non-empty string"
    if not isinstance(obj.get("subject_name", ""), str):
        return None, "'subject_name' must be a string"
    if obj.get("object") is not None and (not isinstance(obj["object"], str) or not obj["object"].strip()):
        return None, "'object' must be an entity id or null"
    return FactRecord(id=f"{obj['subject']}:{obj['relation']}", passage_id=obj["passage_id"]), None


CHECKS = {"questions": _check_question, "corpus": _check_passage, "facts": _check_fact}
#: every kind ``data/validate.py --kind`` accepts
KINDS = tuple(CHECKS)


def _scan(path: Path, kind: str) -> Iterator[tuple[str, Any, str | None]]:
    """Yield ``(where, record, problem)`` for every non-blank line; exactly one of the last two is set."""
    check = CHECKS[kind]
    seen: dict[str, int] = {}
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield where, None, f"not valid UTF-8 ({err.reason} at byte {err.start})"
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                yield where, None, f"not valid JSON ({err.msg} at column {err.colno})"
                continue
            record, problem = check(obj)
            if problem is None and record.id in seen:
                problem = f"duplicate id {record.id!r} (first on line {seen[record.id]})"
            elif problem is None:
                seen[record.id] = lineno
            yield where, (None if problem else record), problem


def iter_problems(path: str | Path, kind: str, allow_empty: bool = False) -> Iterator[str]:
    """Every problem in a JSONL file as ``file:line: problem`` (empty when the file is fine); a file
    with no records is a problem unless ``allow_empty`` (a world split may legitimately be empty)."""
    path = Path(path)
    if not path.is_file():
        yield f"{path}: file not found"
        return
    n = 0
    for where, _, problem in _scan(path, kind):
        n += 1
        if problem:
            yield f"{where}: {problem}"
    if n == 0 and not allow_empty:
        yield f"{path}: no records (the file is empty)"


def _read(path: str | Path, kind: str) -> Iterator[Any]:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    n = 0
    for where, record, problem in _scan(path, kind):
        if problem:
            raise DataError(f"{where}: {problem}")
        n += 1
        yield record
    if n == 0:
        raise DataError(f"{path}: no records (the file is empty)")


def read_questions(path: str | Path, limit: int | None = None) -> list[Question]:
    """All questions of a FlashRAG or R1-Searcher JSONL file (validated; ``limit`` keeps the first N)."""
    out: list[Question] = []
    for q in _read(path, "questions"):
        out.append(q)
        if limit is not None and len(out) >= limit:
            break
    return out


def iter_corpus(path: str | Path) -> Iterator[Passage]:
    """Stream the passages of a FlashRAG corpus JSONL (validated as they are read)."""
    return _read(path, "corpus")


def record_kind(obj: Any) -> str | None:
    """The kind a record's keys say it is (``questions``, ``corpus`` or ``facts``), or None.

    >>> record_kind({"id": "w1", "contents": "T\\nx"}), record_kind({"subject": "e1", "relation": "born_in"})
    ('corpus', 'facts')
    >>> record_kind({"idx": 3, "question": "?", "answer": "x"}), record_kind({"foo": 1})
    ('questions', None)
    """
    if not isinstance(obj, dict):
        return None
    if "question" in obj or "golden_answers" in obj or "idx" in obj:
        return "questions"
    if "contents" in obj:
        return "corpus"
    if "subject" in obj and "relation" in obj:
        return "facts"
    return None


def detect_kind(path: str | Path) -> str | None:
    """The kind of the first record that parses (see :func:`record_kind`); ``questions`` for a
    file with no parseable record (its lines are then reported), None for a record of no known kind."""
    with Path(path).open("rb") as fh:
        for raw in fh:
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(obj, dict):
                return record_kind(obj)
    return "questions"


def write_jsonl(path: str | Path, rows: Any) -> int:
    """Write dicts (or records with ``to_dict``) as JSONL; returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            if hasattr(row, "to_dict"):
                row = row.to_dict()
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    return n

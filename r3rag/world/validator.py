"""Prove that a built world is consistent: every answer follows from its supporting passages.

:func:`validate_world` reads a world directory in bounded memory (it streams the corpus and the
relation table, keeping only what the questions point at) and returns a list of problems, each
``"file:line: what is wrong"`` (empty when the world is sound). It checks:

1. the manifest: every file's sha256 and line count match, and the counts add up;
2. the corpus: ids are ``w`` + 7 digits and unique (membership is kept as one byte per id, not
   a set of strings), and every passage is ``"title\\ntext"``;
3. every question: its id, fields and metadata keys (``hops``, ``type``, ``decomposition``,
   ``supporting_ids``, ``answer_type``); ``hops`` equals the number of steps; the question's
   ``supporting_ids`` are the steps' ids in order; every id is in the corpus;
4. every decomposition step: the relation table has the fact ``relation(subject)``, whose value is
   the step's answer and whose home passage is among the step's supporting ids; the answer
   string appears in that passage's text; the step's question names the subject;
5. chaining: in a chain question, step ``i`` is about the object of step ``i-1`` and the gold
   answer is the last step's answer; in a comparison or yes/no question the gold answer is
   recomputed from the steps' answers with :func:`r3rag.world.questions.decide`;
6. no entity leakage: every entity named by a step (subject or object) belongs to one split only.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Iterator

from r3rag.world.generator import MONTHS
from r3rag.world.questions import decide
from r3rag.world.schema import QUESTION_TYPES, SPLITS

REQUIRED_META = ("hops", "type", "decomposition", "supporting_ids", "answer_type")
CHAIN_TYPES = ("single", "bridge", "compositional", "inference")
PASSAGE_ID = re.compile(r"^w(\d{7})$")
DATE = re.compile(r"^(\d{1,2}) (" + "|".join(MONTHS) + r") (\d{1,4})$")
MAX_PROBLEMS = 200


def sortable(answer: str) -> tuple[Any, ...]:
    """The sortable key of a sub-answer: a date as (year, month, day), a year as (year,)."""
    m = DATE.match(answer)
    if m:
        return (int(m.group(3)), MONTHS.index(m.group(2)) + 1, int(m.group(1)))
    if answer.isdigit():
        return (int(answer),)
    return (answer,)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | None, str]]:
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                yield n, None, f"not valid JSON ({err.msg})"
                continue
            yield n, (obj if isinstance(obj, dict) else None), "" if isinstance(obj, dict) else "not a JSON object"


class _Problems(list):
    def add(self, where: str, what: str) -> None:
        if len(self) < MAX_PROBLEMS:
            self.append(f"{where}: {what}")
        elif len(self) == MAX_PROBLEMS:
            self.append("... more problems not shown")


def _check_manifest(world: Path, problems: _Problems) -> None:
    path = world / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        problems.add(str(path), f"cannot read manifest ({err})")
        return
    for name, info in manifest.get("files", {}).items():
        fp = world / name
        if not fp.is_file():
            problems.add(str(fp), "listed in the manifest but missing")
            continue
        sha, lines = hashlib.sha256(), 0
        with fp.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                sha.update(chunk)
                lines += chunk.count(b"\n")
        if sha.hexdigest() != info.get("sha256"):
            problems.add(str(fp), "sha256 differs from the manifest (file changed after the build)")
        if lines != info.get("lines"):
            problems.add(str(fp), f"{lines} lines, manifest says {info.get('lines')}")
    counts = manifest.get("counts", {})
    if counts.get("passages") != manifest.get("files", {}).get("corpus.jsonl", {}).get("lines"):
        problems.add(str(path), "counts.passages does not match corpus.jsonl")


def validate_world(world_dir: str | Path) -> list[str]:
    """Check a world directory; return its problems (``[]`` means every check passed)."""
    world = Path(world_dir)
    problems = _Problems()
    missing = [n for n in ("corpus.jsonl", "facts.jsonl", *(f"{s}.jsonl" for s in SPLITS)) if not (world / n).is_file()]
    if missing:
        return [f"{world / n}: missing" for n in missing]
    _check_manifest(world, problems)

    # Questions first: what facts and passages do they need?
    questions: list[tuple[str, int, dict[str, Any]]] = []
    for split in SPLITS:
        path = world / f"{split}.jsonl"
        seen_ids: set[str] = set()
        for n, q, err in _lines(path):
            where = f"{path}:{n}"
            if q is None:
                problems.add(where, err)
                continue
            qid = q.get("id")
            if not isinstance(qid, str) or not re.fullmatch(rf"{split}-\d{{6}}", qid):
                problems.add(where, f"id {qid!r} is not {split}-NNNNNN")
            elif qid in seen_ids:
                problems.add(where, f"duplicate id {qid}")
            seen_ids.add(str(qid))
            if _check_shape(q, where, problems):
                questions.append((split, n, q))
    need_facts = {(s["subject"], s["relation"]) for _, _, q in questions for s in q["metadata"]["decomposition"]}

    facts: dict[tuple[str, str], dict[str, Any]] = {}
    fpath = world / "facts.jsonl"
    for n, f, err in _lines(fpath):
        if f is None:
            problems.add(f"{fpath}:{n}", err)
            continue
        key = (f.get("subject"), f.get("relation"))
        if key in need_facts:
            facts[key] = f  # type: ignore[index]
    need_passages = {f["passage_id"] for f in facts.values()}

    texts: dict[str, str] = {}
    cpath = world / "corpus.jsonl"
    present = bytearray()  # present[i] == 1 when passage w{i:07d} is in the corpus: 1 byte/passage
    for n, p, err in _lines(cpath):
        where = f"{cpath}:{n}"
        if p is None:
            problems.add(where, err)
            continue
        pid, contents = p.get("id"), p.get("contents")
        m = PASSAGE_ID.match(str(pid))
        if not m:
            problems.add(where, f"id {pid!r} is not w + 7 digits")
            continue
        i = int(m.group(1))
        if i >= len(present):
            present.extend(bytes(i + 1 - len(present)))
        if present[i]:
            problems.add(where, f"duplicate passage id {pid}")
        present[i] = 1
        if not isinstance(contents, str) or "\n" not in contents or not contents.split("\n", 1)[0].strip():
            problems.add(where, "contents is not 'title\\ntext'")
        elif pid in need_passages:
            texts[pid] = contents.split("\n", 1)[1]

    owner: dict[str, tuple[str, str]] = {}
    for split, n, q in questions:
        _check_question(q, f"{world / (split + '.jsonl')}:{n}", split, facts, texts, present, owner, problems)
    return list(problems)


def _check_shape(q: dict[str, Any], where: str, problems: _Problems) -> bool:
    if not isinstance(q.get("question"), str) or not q["question"].strip():
        problems.add(where, "question is missing or empty")
        return False
    answers = q.get("golden_answers")
    if not isinstance(answers, list) or not answers or not all(isinstance(a, str) and a for a in answers):
        problems.add(where, "golden_answers must be a non-empty list of strings")
        return False
    meta = q.get("metadata")
    if not isinstance(meta, dict):
        problems.add(where, "metadata is missing")
        return False
    absent = [k for k in REQUIRED_META if k not in meta]
    if absent:
        problems.add(where, f"metadata lacks {', '.join(absent)}")
        return False
    steps = meta["decomposition"]
    if not isinstance(steps, list) or not steps or not all(
        isinstance(s, dict) and isinstance(s.get("question"), str) and isinstance(s.get("answer"), str)
        and isinstance(s.get("supporting_ids"), list) and s["supporting_ids"] and "subject" in s and "relation" in s
        for s in steps
    ):
        problems.add(where, "decomposition must be a list of {question, answer, supporting_ids, subject, relation}")
        return False
    if meta["type"] not in QUESTION_TYPES:
        problems.add(where, f"type {meta['type']!r} is not one of {', '.join(QUESTION_TYPES)}")
        return False
    if not isinstance(meta["hops"], int) or not 1 <= meta["hops"] <= 4 or meta["hops"] != len(steps):
        problems.add(where, f"hops {meta['hops']!r} does not match {len(steps)} decomposition steps")
        return False
    return True


def _check_question(
    q: dict[str, Any], where: str, split: str, facts: dict, texts: dict[str, str], present: bytearray,
    owner: dict[str, tuple[str, str]], problems: _Problems,
) -> None:
    meta = q["metadata"]
    steps = meta["decomposition"]
    ordered: list[str] = []
    for s in steps:
        ordered.extend(pid for pid in s["supporting_ids"] if pid not in ordered)
    if meta["supporting_ids"] != ordered:
        problems.add(where, "supporting_ids are not the steps' supporting ids in order")
    for pid in meta["supporting_ids"]:
        m = PASSAGE_ID.match(str(pid))
        if not m or int(m.group(1)) >= len(present) or not present[int(m.group(1))]:
            problems.add(where, f"supporting passage {pid!r} is not in the corpus")

    objects: list[str | None] = []
    for i, s in enumerate(steps):
        fact = facts.get((s["subject"], s["relation"]))
        if fact is None:
            problems.add(where, f"step {i + 1}: no fact {s['relation']}({s['subject']}) in facts.jsonl")
            return
        objects.append(fact.get("object"))
        if fact["value"] != s["answer"]:
            problems.add(where, f"step {i + 1}: answer {s['answer']!r} but the relation table says {fact['value']!r}")
        if fact["passage_id"] not in s["supporting_ids"]:
            problems.add(where, f"step {i + 1}: the fact's passage {fact['passage_id']} is not a supporting id")
        elif s["answer"] not in texts.get(fact["passage_id"], ""):
            problems.add(where, f"step {i + 1}: answer {s['answer']!r} does not appear in passage {fact['passage_id']}")
        if fact.get("subject_name", "") not in s["question"]:
            problems.add(where, f"step {i + 1}: sub-question does not name its subject {fact.get('subject_name')!r}")
        for ent in (s["subject"], fact.get("object")):
            if ent is None:
                continue
            first = owner.setdefault(ent, (split, where))
            if first[0] != split:
                problems.add(where, f"entity {ent} also appears in {first[0]} ({first[1]}): leakage across splits")

    gold = q["golden_answers"][0]
    compare = meta.get("compare")
    if meta["type"] in CHAIN_TYPES:
        for i in range(1, len(steps)):
            if steps[i]["subject"] != objects[i - 1]:
                problems.add(where, f"step {i + 1} is not about the answer of step {i}")
        if gold != steps[-1]["answer"]:
            problems.add(where, f"gold answer {gold!r} is not the last step's answer {steps[-1]['answer']!r}")
    elif not isinstance(compare, dict) or compare.get("op") not in ("earlier", "later", "same", "before"):
        problems.add(where, "a comparison or yes/no question needs metadata.compare {op, steps, options}")
    else:
        try:
            expected = decide(compare, steps, [sortable(s["answer"]) for s in steps])
        except (IndexError, KeyError, TypeError, ValueError):
            problems.add(where, "metadata.compare does not fit the decomposition")
            return
        if gold != expected:
            problems.add(where, f"gold answer {gold!r}, but the sub-answers give {expected!r}")

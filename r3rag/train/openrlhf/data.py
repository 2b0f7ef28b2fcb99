"""OpenRLHF prompt rows from our questions.

OpenRLHF's prompt dataset gives the executor ``prompt = row[input_key]`` and
``label = row[label_key]``. We keep the prompt raw (the question: the plugin renders it with our
format, so OpenRLHF's ``--data.apply_chat_template`` must stay off) and put everything a reward
recipe needs in the label, as a JSON string: ``{"id", "golden_answers", "metadata"}`` where
metadata keeps only what recipes read (gold supporting passage ids, the decomposition).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from r3rag.data.records import Question

REWARD_METADATA = ("supporting_ids", "decomposition")


def prompt_row(q: Question, input_key: str = "question", label_key: str = "label") -> dict[str, Any]:
    """One OpenRLHF dataset row.

    >>> prompt_row(Question("7", "Who?", ["Ann"], {"supporting_ids": ["p1"], "noise": 1}))
    {'question': 'Who?', 'label': '{"id": "7", "golden_answers": ["Ann"], "metadata": {"supporting_ids": ["p1"]}}'}
    """
    meta = {k: q.metadata[k] for k in REWARD_METADATA if k in q.metadata}
    label = {"id": q.id, "golden_answers": list(q.golden_answers), "metadata": meta}
    return {input_key: q.question, label_key: json.dumps(label, ensure_ascii=False)}


def prompt_rows(questions: Iterable[Question], **kw: str) -> list[dict[str, Any]]:
    return [prompt_row(q, **kw) for q in questions]

"""The two in-memory record types every stage shares: a question and a passage.

They follow FlashRAG's JSONL conventions: a dataset line is
``{"id", "question", "golden_answers": [str], "metadata": {...}}`` and a corpus line is
``{"id", "contents"}`` with ``contents = "title\\ntext"``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Question:
    id: str
    question: str
    golden_answers: list[str]
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Passage:
    """A corpus passage; ``score`` is set when it comes back from a search."""

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        return self.contents.split("\n", 1)[0]

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) == 2 else ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "contents": self.contents}
        if self.score is not None:
            d["score"] = self.score
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Passage":
        return cls(id=str(d["id"]), contents=d["contents"], score=d.get("score"))


def gold_passage_ids(meta: dict[str, Any] | None) -> list[str]:
    """A question's gold supporting passage ids, in order: ``supporting_ids``, else the union of
    its decomposition steps' ``supporting_ids``; ``[]`` when it has none.

    >>> gold_passage_ids({"decomposition": [{"supporting_ids": ["p1"]}, {"supporting_ids": ["p2", "p1"]}]})
    ['p1', 'p2']
    """
    meta = meta or {}
    ids = [str(i) for i in meta.get("supporting_ids") or []]
    if not ids:
        for hop in meta.get("decomposition") or []:
            ids.extend(str(i) for i in hop.get("supporting_ids", []) if str(i) not in ids)
    return ids

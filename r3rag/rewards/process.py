"""Per-step process reward: how relevant each query step's documents are (0-1).

R3-RAG scores each retrieval step with a judge model reading the question, the step's analysis,
its query and the documents it brought back. On the embedded world the gold supporting passages
are known, so relevance can be computed exactly, without a judge (the tests and CPU training
use this):

``new_hit`` (default)
    1.0 if the step's documents include a gold supporting passage that no earlier step of the
    trajectory retrieved, else 0.0. Re-issuing a query that found a gold passage earns nothing
    the second time.
``recall``
    (gold supporting passages first retrieved at this step) / (all gold supporting passages):
    the step's share of the trajectory's supporting-passage recall; the steps sum to the recall.

Gold ids come from ``metadata["supporting_ids"]``, else from the union of
``metadata["decomposition"][*]["supporting_ids"]``. A step with no documents (a failed
retrieval) scores 0.0 in every mode and is never sent to the judge. Non-query steps have no
relevance (``None``).

>>> from r3rag.rollout.trajectory import Trajectory, Step
>>> from r3rag.data.records import Passage
>>> P = lambda i: Passage(i, "t\\nx")
>>> t = Trajectory("q", "?", "r3rag_steps", steps=[Step(0, query="a", documents=[P("g1"), P("d")]),
...     Step(1, query="a", documents=[P("g1")]), Step(2, query="b", documents=[P("g2")]), Step(3, answer="x")],
...     metadata={"supporting_ids": ["g1", "g2"]})
>>> gold_relevance(t, "new_hit"), gold_relevance(t, "recall")
([1.0, 0.0, 1.0, None], [0.5, 0.0, 0.5, None])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, Sequence

from pydantic import field_validator

from r3rag.config import Section
from r3rag.data.records import gold_passage_ids
from r3rag.rewards.judge.client import JudgeClient, JudgeRequest
from r3rag.rollout.trajectory import Trajectory

GoldMode = Literal["new_hit", "recall"]


class ProcessConfig(Section):
    source: Literal["gold", "judge", "off"] = "gold"
    gold_mode: GoldMode = "new_hit"

    @field_validator("source", mode="before")
    @classmethod
    def _yaml_off(cls, value: object) -> object:
        return "off" if value is False else value  # YAML reads a bare `off` as false


def supporting_ids(traj: Trajectory) -> set[str] | None:
    """The gold supporting passage ids, or None when the question carries none."""
    return set(gold_passage_ids(traj.metadata)) or None


def _new_hit(new: set[str], gold: set[str]) -> float:
    return 1.0 if new else 0.0


def _recall(new: set[str], gold: set[str]) -> float:
    return len(new) / len(gold)


GOLD_MODES: dict[str, Callable[[set[str], set[str]], float]] = {"new_hit": _new_hit, "recall": _recall}


def gold_relevance(traj: Trajectory, mode: str = "new_hit") -> list[float | None]:
    """Per-step gold relevance (None for non-query steps); all zeros when no gold ids are known."""
    gold = supporting_ids(traj) or set()
    score = GOLD_MODES[mode]
    seen: set[str] = set()
    out: list[float | None] = []
    for step in traj.steps:
        if step.query is None:
            out.append(None)
            continue
        ids = {p.id for p in step.documents}
        new = (ids & gold) - seen
        seen |= ids & gold
        out.append(score(new, gold) if gold and ids else 0.0)
    return out


def gold_recall(traj: Trajectory) -> float | None:
    """Share of the gold supporting passages among everything the trajectory retrieved: the sum of
    its steps' ``recall`` relevance (None when the question carries no gold ids).

    >>> from r3rag.data.records import Passage
    >>> from r3rag.rollout.trajectory import Step
    >>> t = Trajectory("q", "?", "r3rag_steps", steps=[Step(0, query="a", documents=[Passage("g1", "x"), Passage("d", "y")]),
    ...     Step(1, answer="z")], metadata={"supporting_ids": ["g1", "g2"]})
    >>> gold_recall(t)
    0.5
    """
    if supporting_ids(traj) is None:
        return None
    return sum(v or 0.0 for v in gold_relevance(traj, "recall"))


@dataclass
class StepRelevance:
    """One trajectory's per-step relevance; ``missing`` names steps whose judge result failed."""

    values: list[float | None]
    missing: list[str]


def judge_relevance(trajs: Sequence[Trajectory], judge: JudgeClient) -> list[StepRelevance]:
    """Per-step judge relevance for a batch: one batched judge call for every query step with documents.

    A failed judge result leaves that step's value ``None`` and its status in ``missing``
    (``step2:timeout``); the recipe's failure policy decides what it is worth.
    """
    requests: list[JudgeRequest] = []
    where: list[tuple[int, int]] = []
    out = [StepRelevance([None] * len(t.steps), []) for t in trajs]
    for ti, t in enumerate(trajs):
        for si, step in enumerate(t.steps):
            if step.query is None:
                continue
            if not step.documents:
                out[ti].values[si] = 0.0
                continue
            requests.append(judge.relevance_request(t.question, step.analysis, step.query, [p.contents for p in step.documents]))
            where.append((ti, si))
    for (ti, si), res in zip(where, judge.judge(requests)):
        out[ti].values[si] = res.value
        if not res.ok:
            out[ti].missing.append(f"step{si + 1}:{res.status}")
    return out

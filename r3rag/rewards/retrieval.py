"""Retrieval reward: did the trajectory search at all, and did it search sensibly?

``retrieval_reward = 1[at least one query]
                     - repeat_penalty * (queries repeating an earlier query, after squad normalisation)
                     - over_budget_penalty * max(0, queries - budget)``

R1-Searcher stage 1 uses only the first term (weighted 0.5), so issuing the same query five
times earns exactly what one query earns; the penalties make repetition and search spam cost.

Only queries the retriever actually answered count (``Step.retrieved``): a query that was parsed
but never executed (the last allowed step, a retrieval outage) earns nothing.

>>> from r3rag.rollout.trajectory import Trajectory, Step
>>> t = Trajectory("q", "?", "r1searcher_tags", steps=[Step(0, query="X", retrieved=True),
...     Step(1, query="x.", retrieved=True), Step(2, answer="a")])
>>> repeated_queries(t), retrieval_rewards([t], RetrievalConfig()), retrieval_rewards([t], RetrievalConfig(repeat_penalty=0.25))
(1, [1.0], [0.75])
"""

from __future__ import annotations

from typing import Sequence

from r3rag.config import Section
from r3rag.metrics import normalize_squad
from r3rag.rollout.trajectory import Trajectory


class RetrievalConfig(Section):
    repeat_penalty: float = 0.0
    budget: int | None = None
    over_budget_penalty: float = 0.0


def issued_queries(traj: Trajectory) -> list[str]:
    """The non-empty queries the retriever answered (parsed but unexecuted queries do not count)."""
    return [s.query for s in traj.steps if s.query is not None and s.query.strip() and s.retrieved]


def repeated_queries(traj: Trajectory) -> int:
    """How many queries repeat an earlier one of the same trajectory (normalised)."""
    seen: set[str] = set()
    repeats = 0
    for q in issued_queries(traj):
        key = normalize_squad(q)
        repeats += key in seen
        seen.add(key)
    return repeats


def retrieved_at_least_once(trajs: Sequence[Trajectory]) -> list[float]:
    return [1.0 if issued_queries(t) else 0.0 for t in trajs]


def retrieval_rewards(trajs: Sequence[Trajectory], cfg: RetrievalConfig) -> list[float]:
    """Batched retrieval reward (formula in the module docstring)."""
    out: list[float] = []
    for t in trajs:
        n = len(issued_queries(t))
        value = 1.0 if n else 0.0
        value -= cfg.repeat_penalty * repeated_queries(t)
        if cfg.budget is not None:
            value -= cfg.over_budget_penalty * max(0, n - cfg.budget)
        out.append(value)
    return out

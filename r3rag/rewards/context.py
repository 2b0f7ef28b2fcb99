"""Batch-level computation shared by the components: each table computed once, on demand.

A recipe's components ask the :class:`ScoringContext` for what they need (format violations,
answer scores, correctness, per-step relevance); each is computed once per batch, and the judge
is called at most once per kind for the whole batch.
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Sequence

from r3rag.rewards.answer import Correctness, answer_scores, correctness
from r3rag.rewards.format import Violation, format_violations
from r3rag.rewards.judge.client import JudgeClient
from r3rag.rewards.process import StepRelevance, gold_relevance, judge_relevance, supporting_ids
from r3rag.rewards.retrieval import retrieval_rewards
from r3rag.rollout.trajectory import Trajectory

if TYPE_CHECKING:
    from r3rag.rewards.recipes import RewardConfig


class ScoringContext:
    def __init__(self, trajs: Sequence[Trajectory], config: "RewardConfig", judge: JudgeClient | None) -> None:
        self.trajs = list(trajs)
        self.config = config
        self.judge = judge

    @cached_property
    def violations(self) -> list[list[Violation]]:
        return [format_violations(t, self.config.format) for t in self.trajs]

    @cached_property
    def answer(self) -> list[float]:
        return answer_scores(self.trajs, self.config.answer)

    @cached_property
    def correct(self) -> list[Correctness]:
        return correctness(self.trajs, self.config.answer, self.judge)

    @cached_property
    def retrieval(self) -> list[float]:
        return retrieval_rewards(self.trajs, self.config.retrieval)

    @cached_property
    def relevance(self) -> list[StepRelevance]:
        """Per-step relevance under ``process.source`` (None for non-query steps).

        Judge failures stay ``None`` and are named in ``missing``; with ``judge.on_failure:
        rule_only`` the gold relevance fills them where the question has gold ids. A missing
        source (no judge, no gold ids) is named in ``missing`` too, never guessed."""
        cfg = self.config.process
        if cfg.source == "off":
            return [StepRelevance([None] * len(t.steps), []) for t in self.trajs]
        if cfg.source == "judge" and self.judge is None:  # never a silent fallback
            return [StepRelevance([0.0 if s.query is not None else None for s in t.steps],
                                  ["process:no_judge"] if t.queries else []) for t in self.trajs]
        if cfg.source == "gold":
            out = []
            for t in self.trajs:
                missing = [] if supporting_ids(t) is not None or not t.queries else ["process:no_gold_ids"]
                out.append(StepRelevance(gold_relevance(t, cfg.gold_mode), missing))
            return out
        judged = judge_relevance(self.trajs, self.judge)
        if self.config.judge.on_failure == "rule_only":
            for t, rel in zip(self.trajs, judged):
                if rel.missing and supporting_ids(t) is not None:
                    gold = gold_relevance(t, cfg.gold_mode)
                    rel.values = [g if (v is None and g is not None) else v for v, g in zip(rel.values, gold)]
        return judged

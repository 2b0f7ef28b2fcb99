"""Rewards: pure, batched components and the recipes (R3-RAG, R1-Searcher) built from them.

Typical use::

    scorer = load_recipe("configs/rewards/r3rag.yaml", ["process.source=gold"])
    outputs = scorer.score(trajectories)   # list[RewardOutput]: total, per_step, components
"""

from r3rag.rewards.answer import AnswerConfig, Correctness, answer_score, answer_scores, correctness, is_hedged
from r3rag.rewards.format import FormatConfig, Violation, format_validity, format_violations
from r3rag.rewards.process import ProcessConfig, gold_relevance, judge_relevance, supporting_ids
from r3rag.rewards.recipes import (
    SHAPES,
    OutcomeConfig,
    RewardConfig,
    RewardScorer,
    StepwiseConfig,
    Term,
    component_rewards,
    load_recipe,
    load_recipe_config,
)
from r3rag.rewards.registry import COMPONENTS
from r3rag.rewards.retrieval import RetrievalConfig, repeated_queries, retrieval_rewards, retrieved_at_least_once
from r3rag.rewards.types import RewardOutput, summarize

__all__ = [
    "COMPONENTS",
    "SHAPES",
    "AnswerConfig",
    "Correctness",
    "FormatConfig",
    "OutcomeConfig",
    "ProcessConfig",
    "RetrievalConfig",
    "RewardConfig",
    "RewardOutput",
    "RewardScorer",
    "StepwiseConfig",
    "Term",
    "Violation",
    "answer_score",
    "component_rewards",
    "answer_scores",
    "correctness",
    "format_validity",
    "format_violations",
    "gold_relevance",
    "is_hedged",
    "judge_relevance",
    "load_recipe",
    "load_recipe_config",
    "repeated_queries",
    "retrieval_rewards",
    "retrieved_at_least_once",
    "summarize",
    "supporting_ids",
]

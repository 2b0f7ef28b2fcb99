"""The runnable examples in the foundation modules' docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "r3rag.config", "r3rag.metrics", "r3rag.data.hf_datasets", "r3rag.data.readers", "r3rag.rollout.backends.shared_prefix",
    # the format rules (moved from r3rag.rewards.format beside each format)
    "r3rag.rollout.formats.rules", "r3rag.rollout.formats.r3rag_steps_rules", "r3rag.rollout.formats.r1searcher_tags_rules",
    "r3rag.rollout.env", "r3rag.pipeline.child", "r3rag.train.rl.loop", "r3rag.rollout.backends.hf",
    "r3rag.evaluation.evidence", "r3rag.evaluation.replicates", "r3rag.train.rl.estimators", "r3rag.train.rl.batch",
    "r3rag.train.rl.update_noise", "r3rag.precision", "r3rag.machine", "r3rag.evaluation.failures", "r3rag.evaluation.report",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no runnable example"
    assert result.failed == 0

"""The runnable examples in the rewards and judge docstrings run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "r3rag.rewards.types",
    "r3rag.rewards.answer",
    "r3rag.rewards.format",
    "r3rag.rewards.retrieval",
    "r3rag.rewards.process",
    "r3rag.rewards.recipes",
    "r3rag.rewards.judge.parse",
    "r3rag.rewards.judge.cache",
    "r3rag.rewards.judge.client",
    "r3rag.testing.standin_judge",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0, f"{name} has no runnable example"
    assert result.failed == 0

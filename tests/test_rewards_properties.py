"""Invariants of every recipe over generated trajectories (hypothesis, derandomised)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from r3rag.data.records import Passage
from r3rag.rewards import load_recipe
from r3rag.rollout.trajectory import Segment, Step, Trajectory

RECIPES = Path(__file__).resolve().parent.parent / "configs" / "rewards"
SCORERS = {n: load_recipe(RECIPES / f"{n}.yaml") for n in ("r3rag", "outcome_only", "process_only", "r1searcher_stage1", "r1searcher_stage2")}
NAMES = ["Ora Lind", "Ari Voss", "Tam Hale"]


@st.composite
def r3rag_trajs(draw: st.DrawFn) -> Trajectory:
    steps: list[Step] = []
    for k in range(draw(st.integers(0, 5))):
        ids = draw(st.lists(st.sampled_from(["g1", "g2", "d1", "d2"]), max_size=3))
        last = k == 4 or draw(st.booleans())
        broken = draw(st.integers(0, 9)) == 0
        if last and draw(st.booleans()):
            ans = draw(st.sampled_from(NAMES))
            raw = ("" if broken else "The problem analysis: a\n") + f"The final answer: {ans}"
            steps.append(Step(k, answer=ans, raw=raw))
            break
        raw = ("" if broken else "The problem analysis: a\n") + "The retrieval query: q"
        steps.append(Step(k, query="q", documents=[Passage(i, "t\nx") for i in ids], raw=raw))
    return Trajectory("q", "?", "r3rag_steps", steps=steps, golden_answers=["Ora Lind"], metadata={"supporting_ids": ["g1", "g2"]})


@st.composite
def r1_trajs(draw: st.DrawFn) -> Trajectory:
    pieces = draw(st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "<|begin_of_query|>",
                                            "<|end_of_query|>", "Ora Lind", "Ari Voss", " x "]), max_size=12))
    text = "".join(pieces)
    queries = draw(st.integers(0, 3))
    steps = [Step(i, query="q") for i in range(queries)] + [Step(queries, answer=draw(st.sampled_from(NAMES)))]
    return Trajectory("q", "?", "r1searcher_tags", segments=[Segment("model", text, [])], steps=steps, golden_answers=["Ora Lind"])


@pytest.mark.slow
@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r3rag_trajs())
def test_stepwise_invariants(t: Trajectory) -> None:
    allowed_process = {0.0, 0.8, 0.9, 1.6}
    for name in ("r3rag", "outcome_only", "process_only"):
        out = SCORERS[name].score([t])[0]
        assert len(out.per_step) == max(1, len(t.steps))
        assert abs(out.total - sum(out.per_step)) < 1e-9
        for i, r in enumerate(out.per_step):
            step = t.steps[i] if i < len(t.steps) else None
            if r < 0:
                assert r == -0.9 and any(v.startswith(f"step{i + 1}:") or ":" not in v for v in out.violations)
            elif step is not None and step.answer is not None:
                assert r in (0.0, 2.0)
            else:
                assert r in allowed_process
        if name == "outcome_only":
            assert all(r in (0.0, 2.0, -0.9) for r in out.per_step)


@pytest.mark.slow
@settings(max_examples=150, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(r1_trajs())
def test_outcome_invariants(t: Trajectory) -> None:
    s1 = SCORERS["r1searcher_stage1"].score([t])[0]
    s2 = SCORERS["r1searcher_stage2"].score([t])[0]
    assert s1.total in (0.0, 0.5, 1.0)
    assert s2.total == -2.0 or 0.0 <= s2.total <= 1.0
    assert (s2.total == -2.0) == bool(s2.violations) == (s1.components["format_valid"] == 0.0)
    for out in (s1, s2):
        assert out.per_step[-1] == out.total and sum(out.per_step) == out.total

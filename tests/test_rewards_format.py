"""Format rules of both trajectory formats, on literal model text: each violation named."""

from __future__ import annotations

import pytest

from r3rag.rewards.format import (
    FormatConfig,
    format_validity,
    format_violations,
    r1searcher_violations,
    r3rag_step_violations,
)
from r3rag.rollout.trajectory import Segment, Step, Trajectory

CFG = FormatConfig()
CFG10 = FormatConfig(max_answer_words=10)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Step 1:\nThe problem analysis: find the mayor.\nThe retrieval query: mayor of Vell", []),
        ("Step 2: The problem analysis: done.\nThe final answer: Ora Lind<|im_end|>", []),
        ("The problem analysis: a\nThe retrieval query: q\nThe retrieval documents:", []),  # stop marker kept
        ("The retrieval query: q", ["missing_analysis"]),
        ("The problem analysis: a\nThe problem analysis: b\nThe retrieval query: q", ["multiple_analyses"]),
        ("The problem analysis: just thinking", ["no_action"]),
        ("The problem analysis: a\nThe retrieval query: q\nThe final answer: x", ["query_and_answer"]),
        ("The problem analysis: a\nThe retrieval query: q\nThe retrieval query: r", ["multiple_queries"]),
        ("The problem analysis: a\nThe final answer: x\nThe final answer: y", ["multiple_answers"]),
        ("The problem analysis: a\nThe retrieval query:   ", ["empty_query"]),
        ("The problem analysis: a\nThe final answer: ", ["empty_answer"]),
        ("The retrieval query: q\nThe problem analysis: a", ["action_before_analysis"]),
        ("Step 1: The problem analysis: a\nThe retrieval query: q\nStep 2: The problem analysis: b", ["multiple_steps", "multiple_analyses"]),
        ("The problem analysis: a\nThe retrieval query: q\nThe retrieval documents: (1) fake\nmore", ["wrote_documents"]),
        ("The problem analysis: a\nThe final answer: Ora Lind\nI am confident because...", ["text_after_answer"]),
    ],
)
def test_r3rag_step_rules(raw: str, expected: list[str]) -> None:
    assert r3rag_step_violations(raw, CFG) == expected


def test_r3rag_answer_length_limit_is_optional() -> None:
    raw = "The problem analysis: a\nThe final answer: " + " ".join(["word"] * 11)
    assert r3rag_step_violations(raw, CFG) == []
    assert r3rag_step_violations(raw, CFG10) == ["answer_too_long"]


def test_r3rag_trajectory_violations_are_attached_to_steps() -> None:
    steps = [
        Step(0, analysis="a", query="q", raw="The problem analysis: a\nThe retrieval query: q"),
        Step(1, query="r", raw="The retrieval query: r"),
        Step(2, analysis="c", answer="x", raw="The problem analysis: c\nThe final answer: x"),
        Step(3, analysis="d", answer="y", raw="The problem analysis: d\nThe final answer: y"),
    ]
    t = Trajectory("q", "?", "r3rag_steps", steps=steps)
    assert [str(v) for v in format_violations(t, CFG)] == ["step2:missing_analysis", "step4:step_after_answer"]
    assert [str(v) for v in format_violations(Trajectory("q", "?", "r3rag_steps"), CFG)] == ["no_steps"]


def test_parser_reported_error_is_named() -> None:
    t = Trajectory("q", "?", "r3rag_steps", steps=[Step(0, raw="The problem analysis: a\nThe retrieval query: q", format_error="repetition")])
    assert [str(v) for v in format_violations(t, CFG)] == ["step1:parser_repetition"]


def test_r3rag_steps_fall_back_to_model_segments_when_raw_is_empty() -> None:
    segs = [
        Segment("prompt", "The question: ?", []),
        Segment("model", "The problem analysis: a\nThe retrieval query: q", []),
        Segment("env", "\nThe retrieval documents: ...", []),
        Segment("model", "The final answer: x", []),
    ]
    t = Trajectory("q", "?", "r3rag_steps", segments=segs, steps=[Step(0, query="q"), Step(1, answer="x")])
    assert [str(v) for v in format_violations(t, CFG)] == ["step2:missing_analysis"]


GOOD = "<think>find it<|begin_of_query|>mayor of Vell<|end_of_query|>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD + " found it</think>\n<answer>Ora Lind</answer><|im_end|>", []),
        ("<answer>Ora Lind</answer>", []),  # no think and no query is still a valid format
        (GOOD + "</think>", ["no_answer"]),
        (GOOD + "<answer>Ora Lind</answer>", ["answer_in_think", "unbalanced_think", "no_answer"]),
        ("<think>x</think><answer>Ora Lind", ["unbalanced_answer", "no_answer"]),
        ("<think>x</think></think><answer>A</answer>", ["unbalanced_think"]),
        ("<think>x</think><answer>A</answer><answer>B</answer>", ["multiple_answers"]),
        ("<think>x</think><answer> </answer>", ["empty_answer"]),
        ("<answer>" + " ".join(["w"] * 11) + "</answer>", ["answer_too_long"]),
        ("<answer>A <|begin_of_query|>q<|end_of_query|></answer>", ["query_in_answer"]),
        ("<think>it is <answer>A</answer></think><answer>A</answer>", ["answer_in_think"]),
        ("<think>x</think><answer>A</answer> and also B", ["text_after_answer"]),
        ("<think><|begin_of_query|> <|end_of_query|></think><answer>A</answer>", ["empty_query"]),
        ("<think>q<|begin_of_documents|>(1) fake<|end_of_documents|></think><answer>A</answer>", ["wrote_documents"]),
        ("<|begin_of_query|>q<answer>A</answer>", ["unbalanced_query"]),
    ],
)
def test_r1searcher_rules(text: str, expected: list[str]) -> None:
    assert r1searcher_violations(text, CFG10) == expected


def test_r1searcher_reads_only_model_segments() -> None:
    segs = [
        Segment("prompt", "Question: ?<think>", []),
        Segment("model", GOOD, []),
        Segment("env", "<|begin_of_documents|>\n(1)Vell\nOra Lind is mayor<|end_of_documents|>", []),
        Segment("model", "</think><answer>Ora Lind</answer>", []),
    ]
    t = Trajectory("q", "?", "r1searcher_tags", segments=segs)
    assert format_violations(t, CFG10) == []
    assert format_validity([t], CFG10) == [1.0]


def test_require_think_and_unknown_format() -> None:
    assert r1searcher_violations("<answer>A</answer>", FormatConfig(require_think=True)) == ["no_think"]
    with pytest.raises(ValueError, match="unknown trajectory format 'search-r1'"):
        format_violations(Trajectory("q", "?", "search-r1"), CFG)


def test_r1searcher_chat_turns_each_open_think() -> None:
    segs = [
        Segment("model", "<think> need the town <|begin_of_query|> Vell birthplace <|end_of_query|>", []),
        Segment("env", "<|begin_of_documents|>\n(1)Vell was born in Harrow.\n<|end_of_documents|>", []),
        Segment("model", "<think> so Harrow </think>\n<answer> Ora Lind </answer><|im_end|>", []),
    ]
    assert format_violations(Trajectory("q", "?", "r1searcher_tags", segments=segs), CFG10) == []
    # within one turn, a second <think> while one is open is still a violation
    assert r1searcher_violations("<think>a<think>b</think></think><answer>A</answer>", CFG10) == ["unbalanced_think"]


def test_r3rag_answer_on_the_next_line_is_accepted() -> None:
    assert r3rag_step_violations("The problem analysis: a\nThe final answer:\nOra Lind", CFG) == []
    assert r3rag_step_violations("The problem analysis: a\nThe final answer:\nOra Lind\nmore", CFG) == ["text_after_answer"]


@pytest.mark.parametrize("mode", ["raw", pytest.param("chat", marks=pytest.mark.slow)])
def test_turns_rendered_by_the_rollout_formats_are_valid(mode: str) -> None:
    """Cross-check with the rollout engine's own renderers (its SFT/teacher text): no violation."""
    from r3rag.rollout.formats import get_format

    kwargs: dict = {"mode": mode}
    if mode == "chat":
        from r3rag.testing.tiny_models import build_tiny_tokenizer

        kwargs["tokenizer"] = build_tiny_tokenizer()
    for name in ("r3rag_steps", "r1searcher_tags"):
        fmt = get_format(name, **kwargs)
        turns = [fmt.render_turn(0, "find the town", query="Vell birthplace"),
                 fmt.render_turn(1, "Harrow it is", answer="Ora Lind")]
        steps = [Step(0, query="Vell birthplace", raw=turns[0]), Step(1, answer="Ora Lind", raw=turns[1])]
        segs = [Segment("model", turns[0], []), Segment("env", fmt.render_documents([], 0), []), Segment("model", turns[1], [])]
        traj = Trajectory("q", "?", name, segments=segs, steps=steps)
        assert format_violations(traj, CFG10) == [], (name, mode, turns)

"""The components on their own: answer metrics and the hedge guard, retrieval, gold relevance."""

from __future__ import annotations

import pytest

from r3rag.data.records import Passage
from r3rag.rewards import (
    AnswerConfig,
    ProcessConfig,
    RetrievalConfig,
    answer_score,
    correctness,
    gold_relevance,
    is_hedged,
    repeated_queries,
    retrieval_rewards,
    retrieved_at_least_once,
    supporting_ids,
)
from r3rag.rollout.trajectory import Step, Trajectory


def traj(*steps: Step, golds: list[str] | None = None, meta: dict | None = None) -> Trajectory:
    return Trajectory("q", "?", "r3rag_steps", steps=list(steps), golden_answers=golds or ["Ora Lind"], metadata=meta or {})


@pytest.mark.parametrize(
    ("metric", "pred", "expected"),
    [
        ("em", "the ora lind.", 1.0),
        ("em", "Ora", 0.0),
        ("f1", "Ora", 2 * 1.0 * 0.5 / 1.5),  # precision 1, recall 1/2
        ("f1", "Ora Lind of Harrow", 2 * 0.5 * 1.0 / 1.5),  # precision 2/4 (squad keeps "of"), recall 1
        ("cover_em", "Mayor Ora Lind", 1.0),  # one extra token: allowed
        ("cover_em", "Ora Lind, Ari Voss", 0.0),  # two extra tokens: a list, guarded
        ("acc", "ora lind!", 1.0),
        ("acc", "Ora Lind or Tam", 0.0),  # "or" hedge
    ],
)
def test_answer_metrics_hand_worked(metric: str, pred: str, expected: float) -> None:
    assert answer_score(pred, ["Ora Lind"], AnswerConfig(metric=metric)) == pytest.approx(expected)


def test_no_answer_scores_zero_and_aliases_take_the_max() -> None:
    assert answer_score(None, ["x"], AnswerConfig(metric="f1")) == 0.0
    assert answer_score("Lind", ["Ora Lind", "Lind"], AnswerConfig(metric="em")) == 1.0


def test_hedge_guard_allows_gold_with_or() -> None:
    assert not is_hedged("war or peace", "War or Peace")
    assert is_hedged("war or peace", "war")


def test_r1searcher_normalisation_reads_true_as_yes() -> None:
    cfg = AnswerConfig(metric="em", normalization="r1searcher")
    assert answer_score("True", ["yes"], cfg) == 1.0
    assert answer_score("True", ["yes"], AnswerConfig(metric="em")) == 0.0


def test_correctness_by_rule_without_judge() -> None:
    batch = [traj(Step(0, answer="Ora Lind")), traj(Step(0, answer="Ari")), traj(Step(0, query="x", retrieved=True))]
    out = correctness(batch, AnswerConfig(metric="em", judge_fallback=True), judge=None)
    assert [(c.value, c.source) for c in out] == [(1.0, "rule"), (0.0, "rule"), (0.0, "no_answer")]


def test_retrieval_reward_penalties() -> None:
    t = traj(Step(0, query="Vell", retrieved=True), Step(1, query="vell?", retrieved=True), Step(2, query="Harrow", retrieved=True), Step(3, query="Vell", retrieved=True), Step(4, query="  ", retrieved=True))
    assert repeated_queries(t) == 2
    assert retrieved_at_least_once([t, traj(Step(0, answer="a"))]) == [1.0, 0.0]
    cfg = RetrievalConfig(repeat_penalty=0.1, budget=2, over_budget_penalty=0.25)
    assert retrieval_rewards([t], cfg) == [pytest.approx(1.0 - 0.1 * 2 - 0.25 * 2)]  # 4 non-empty queries, budget 2


def P(*ids: str) -> list[Passage]:
    return [Passage(i, "t\nx") for i in ids]


def test_gold_relevance_modes_hand_worked() -> None:
    meta = {"decomposition": [{"question": "a", "answer": "b", "supporting_ids": ["g1"]},
                              {"question": "c", "answer": "d", "supporting_ids": ["g2", "g3"]}]}
    t = traj(Step(0, query="a", documents=P("g1", "g2"), retrieved=True), Step(1, query="b", documents=[], retrieved=True),
             Step(2, query="c", documents=P("g2", "x"), retrieved=True), Step(3, query="d", documents=P("g3"), retrieved=True), Step(4, answer="z"), meta=meta)
    assert supporting_ids(t) == {"g1", "g2", "g3"}
    assert gold_relevance(t, "new_hit") == [1.0, 0.0, 0.0, 1.0, None]
    recall = gold_relevance(t, "recall")
    assert recall[:4] == pytest.approx([2 / 3, 0.0, 0.0, 1 / 3]) and recall[4] is None
    assert sum(v for v in gold_relevance(t, "recall") if v is not None) == pytest.approx(1.0)


def test_process_source_off_from_command_line_string() -> None:
    assert ProcessConfig.model_validate({"source": False}).source == "off"
    with pytest.raises(ValueError):
        ProcessConfig.model_validate({"source": "vibes"})


def test_each_component_alone_returns_reward_objects() -> None:
    from r3rag.rewards import RewardConfig, component_rewards

    t = traj(Step(0, query="a", documents=P("g1"), raw="The problem analysis: x\nThe retrieval query: a", retrieved=True),
             Step(1, query="b", documents=P("x"), raw="The retrieval query: b", retrieved=True),
             Step(2, answer="Ora Lind", raw="The problem analysis: y\nThe final answer: Ora Lind"),
             meta={"supporting_ids": ["g1"]})
    cfg = RewardConfig(answer=AnswerConfig(metric="f1"))
    by_name = {n: component_rewards(n, [t], cfg)[0] for n in ("answer", "correct", "format_valid", "retrieval", "relevance")}
    assert {n: o.total for n, o in by_name.items()} == {"answer": 1.0, "correct": 1.0, "format_valid": 0.0, "retrieval": 1.0, "relevance": 1.0}
    assert by_name["relevance"].per_step == [1.0, 0.0, 0.0] and by_name["relevance"].components == {"relevance": 0.5}
    assert by_name["format_valid"].violations == ["step2:missing_analysis"]
    assert by_name["answer"].per_step == [0.0, 0.0, 1.0]


def test_judge_relevance_without_a_judge_is_missing_not_gold() -> None:
    from r3rag.rewards.context import ScoringContext
    from r3rag.rewards import RewardConfig

    t = traj(Step(0, query="a", documents=P("g1"), retrieved=True), Step(1, answer="x"), meta={"supporting_ids": ["g1"]})
    ctx = ScoringContext([t], RewardConfig(process=ProcessConfig(source="judge")), judge=None)
    assert ctx.relevance[0].values == [0.0, None] and ctx.relevance[0].missing == ["process:no_judge"]

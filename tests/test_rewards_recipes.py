"""Hand-computed totals and per-step rewards of every shipped recipe, corner cases and
reward-hacking probes, on literal trajectories of both formats (no judge needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from r3rag.data.records import Passage
from r3rag.errors import ConfigError
from r3rag.rewards import RewardOutput, load_recipe, load_recipe_config, summarize
from r3rag.rollout.trajectory import Segment, Step, Trajectory

RECIPES = Path(__file__).resolve().parent.parent / "configs" / "rewards"
GOLD = ["Ora Lind"]
META = {"supporting_ids": ["g1", "g2"]}


def recipe(name: str, *overrides: str):
    return load_recipe(RECIPES / f"{name}.yaml", overrides)


def docs(*ids: str) -> list[Passage]:
    return [Passage(i, f"Title {i}\ntext of {i}") for i in ids]


def q(i: int, query: str, ids: tuple[str, ...] = (), raw: str | None = None) -> Step:
    raw = raw if raw is not None else f"Step {i + 1}:\nThe problem analysis: need more.\nThe retrieval query: {query}"
    return Step(i, analysis="need more.", query=query, documents=docs(*ids), raw=raw, retrieved=True)


def a(i: int, answer: str, raw: str | None = None) -> Step:
    raw = raw if raw is not None else f"Step {i + 1}:\nThe problem analysis: known now.\nThe final answer: {answer}"
    return Step(i, analysis="known now.", answer=answer, raw=raw)


def r3(*steps: Step, stop: str = "answered") -> Trajectory:
    return Trajectory("w1", "Who is the mayor of the town where Vell was born?", "r3rag_steps", steps=list(steps),
                      stop_reason=stop, golden_answers=GOLD, metadata=dict(META))


def approx(values: list[float]) -> list[float]:
    return pytest.approx(values, abs=1e-9)


# ---- R3-RAG recipe ----------------------------------------------------------------------------
R3_CASES = {
    # name: (trajectory, per-step rewards worked by hand)
    "correct": (r3(q(0, "Vell birthplace", ("g1", "d1")), q(1, "Harrow mayor", ("d2",)), q(2, "Harrow town mayor", ("g2",)), a(3, "Ora Lind")),
                [1.0 * 1.6, 0.0, 1.0 * 1.6, 2.0]),
    "wrong": (r3(q(0, "Vell birthplace", ("g1",)), a(1, "Ari Voss")), [1.0 * 0.8, 0.0]),
    "no_answer": (r3(q(0, "a", ("g1",)), q(1, "b", ("d1",)), q(2, "c", ("d2",)), q(3, "d", ("g2",)), q(4, "e", ("d3",)), stop="max_steps"),
                  [0.9, 0.0, 0.0, 0.9, 0.0]),
    "answer_without_retrieval": (r3(a(0, "Ora Lind")), [2.0]),
    "format_error_step2": (r3(q(0, "a", ("g1",)), q(1, "b", ("g2",), raw="The retrieval query: b"), a(2, "Ora Lind")),
                           [1.6, -0.9, 2.0]),
    "two_answers": (r3(q(0, "a", ("g1",)), a(1, "Ari Voss", raw="The problem analysis: x\nThe final answer: Ari Voss\nThe final answer: Ora Lind")),
                    [0.8, -0.9]),
    "empty_documents_after_failed_retrieval": (r3(q(0, "a", ()), q(1, "a again", ("g1",)), a(2, "ora lind.")), [0.0, 1.6, 2.0]),
    "repeated_query": (r3(q(0, "a", ("g1",)), q(1, "a", ("g1",)), q(2, "a", ("g1",)), a(3, "Ora Lind")), [1.6, 0.0, 0.0, 2.0]),
    "no_steps": (r3(stop="max_tokens"), [-0.9]),
}


@pytest.mark.parametrize("case", sorted(R3_CASES))
def test_r3rag_recipe_hand_computed(case: str) -> None:
    traj, expected = R3_CASES[case]
    out = recipe("r3rag").score([traj])[0]
    assert out.per_step == approx(expected)
    assert out.total == pytest.approx(sum(expected))
    assert out.components["outcome"] + out.components["process"] + out.components["format_penalty"] == pytest.approx(out.total)


def test_r3rag_components_and_violations_are_named() -> None:
    traj, _ = R3_CASES["format_error_step2"]
    out = recipe("r3rag").score([traj])[0]
    assert out.violations == ["step2:missing_analysis"]
    assert out.components["correct"] == 1.0 and out.components["fate_scale"] == 1.6
    assert out.components["num_format_errors"] == 1.0 and out.components["num_retrievals"] == 2.0
    assert out.missing == [] and not out.dropped


def test_r3rag_batch_equals_one_by_one() -> None:
    scorer = recipe("r3rag")
    trajs = [t for t, _ in R3_CASES.values()]
    batch = scorer.score(trajs)
    assert [o.per_step for o in batch] == [scorer.score([t])[0].per_step for t in trajs]


def test_ablations_are_one_line_changes() -> None:
    traj, _ = R3_CASES["correct"]
    assert recipe("outcome_only").score([traj])[0].per_step == approx([0.0, 0.0, 0.0, 2.0])
    assert recipe("process_only").score([traj])[0].per_step == approx([1.6, 0.0, 1.6, 0.0])
    assert recipe("r3rag_gated").score([traj])[0].per_step == approx([1.6, 0.0, 1.6, 2.0])
    full = (RECIPES / "r3rag.yaml").read_text().splitlines()
    for name in ("outcome_only", "process_only", "r3rag_gated"):
        other = (RECIPES / f"{name}.yaml").read_text().splitlines()
        changed = [x for x, y in zip(full, other) if x != y and not x.startswith("name:")]
        assert len(full) == len(other) and len(changed) == 1


def test_gated_process_pays_nothing_after_a_wrong_answer_or_no_answer() -> None:
    # The same gold hits as the "wrong" and "no_answer" cases, which the paper's recipe pays 0.8 / 0.9.
    gated = recipe("r3rag_gated")
    for case in ("wrong", "no_answer"):
        traj, paper = R3_CASES[case]
        assert sum(paper) > 0
        out = gated.score([traj])[0]
        assert out.per_step == approx([0.0] * len(paper))
        assert out.components["process"] == 0.0
    # a group of failures is now all zeros (dynamic filtering drops it); with the paper's recipe it is not
    fails = [R3_CASES["wrong"][0], r3(q(0, "Vell birthplace", ("d1",)), a(1, "Ari Voss"))]
    assert [o.total for o in gated.score(fails)] == approx([0.0, 0.0])
    assert [o.total for o in recipe("r3rag").score(fails)] == approx([0.8, 0.0])


def test_gold_recall_mode_and_overrides() -> None:
    traj, _ = R3_CASES["correct"]
    out = recipe("r3rag", "process.gold_mode=recall", "stepwise.fate_scale.correct=2.0").score([traj])[0]
    assert out.per_step == approx([0.5 * 2.0, 0.0, 0.5 * 2.0, 2.0])


def test_gold_mode_without_gold_ids_is_marked_missing_not_guessed() -> None:
    traj = r3(q(0, "a", ("g1",)), a(1, "Ora Lind"))
    traj.metadata = {}
    out = recipe("r3rag").score([traj])[0]
    assert out.per_step == approx([0.0, 2.0])
    assert out.missing == ["process:no_gold_ids"]


def test_scores_trajectory_dicts_from_rollout_output() -> None:
    traj, expected = R3_CASES["correct"]
    assert recipe("r3rag").score([traj.to_dict()])[0].per_step == approx(expected)


def test_rollout_engine_format_names_are_accepted() -> None:
    traj, expected = R3_CASES["format_error_step2"]
    traj.format_name = "r3rag_steps"
    assert recipe("r3rag").score([traj])[0].per_step == approx(expected)


# ---- R1-Searcher recipes ----------------------------------------------------------------------
QUERY = "<think>I need the birthplace.<|begin_of_query|>Vell birthplace<|end_of_query|>"
DOCS = "<|begin_of_documents|>\n(1)Vell was born in Harrow.\n<|end_of_documents|>"


def r1(*model_turns: str, queries: tuple[str, ...] = ("Vell birthplace",), answer: str | None = "Ora Lind") -> Trajectory:
    segs = [Segment("prompt", "Question: Who is the mayor ...?", [])]
    for i, text in enumerate(model_turns):
        if i:
            segs.append(Segment("env", DOCS, []))
        segs.append(Segment("model", text, []))
    steps = [Step(i, query=qq, documents=docs("d"), retrieved=True) for i, qq in enumerate(queries)]
    if answer is not None:
        steps.append(Step(len(steps), answer=answer))
    return Trajectory("w1", "Who is the mayor ...?", "r1searcher_tags", segments=segs, steps=steps, golden_answers=GOLD)


LONG = "the mayor is surely Ora Lind of Harrow town as records show"  # 11 words
R1_CASES = {
    # name: (trajectory, stage-1 total, stage-2 total), by hand
    "valid": (r1(QUERY, " Harrow's mayor.</think><answer>Ora Lind</answer>"), 1.0, 1.0),
    "partial_answer": (r1(QUERY, "</think><answer>Lind</answer>", answer="Lind"), 1.0, 2 * 1.0 * 0.5 / 1.5),
    "no_answer": (r1(QUERY, " still thinking</think>", answer=None), 0.5, -2.0),
    "answer_without_retrieval": (r1("<think>I know it.</think><answer>Ora Lind</answer>", queries=()), 0.5, 1.0),
    "two_answers": (r1(QUERY, "</think><answer>Ari Voss</answer><answer>Ora Lind</answer>"), 0.5, -2.0),
    "answer_too_long": (r1(QUERY, f"</think><answer>{LONG}</answer>", answer=LONG), 0.5, -2.0),
    "answer_hidden_in_think": (r1(QUERY, " so <answer>Ora Lind</answer></think>"), 0.5, -2.0),
    "text_after_answer": (r1(QUERY, "</think><answer>Ora Lind</answer> or maybe Ari Voss"), 0.5, -2.0),
    "query_in_answer": (r1(QUERY, "</think><answer>Ora Lind <|begin_of_query|>x<|end_of_query|></answer>"), 0.5, -2.0),
    "unbalanced_think": (r1(QUERY, "</think></think><answer>Ora Lind</answer>"), 0.5, -2.0),
}


@pytest.mark.parametrize("case", sorted(R1_CASES))
def test_r1searcher_stages_hand_computed(case: str) -> None:
    traj, stage1, stage2 = R1_CASES[case]
    o1 = recipe("r1searcher_stage1").score([traj])[0]
    o2 = recipe("r1searcher_stage2").score([traj])[0]
    assert o1.total == pytest.approx(stage1)
    assert o2.total == pytest.approx(stage2)
    for out in (o1, o2):  # outcome-only: everything on the last step
        assert out.per_step[:-1] == [0.0] * (len(out.per_step) - 1)
        assert out.per_step[-1] == pytest.approx(out.total)
        assert len(out.per_step) == len(traj.steps)


def test_llama_penalty_is_a_config_change() -> None:
    traj, _, _ = R1_CASES["no_answer"]
    assert recipe("r1searcher_stage2", "outcome.format_penalty=-1").score([traj])[0].total == -1.0


def test_stage2_components() -> None:
    traj, _, _ = R1_CASES["text_after_answer"]
    out = recipe("r1searcher_stage2").score([traj])[0]
    assert out.violations == ["text_after_answer"]
    assert out.components["format_valid"] == 0.0 and out.components["format_penalty"] == -2.0
    assert out.components["answer"] == 1.0  # the F1 it would have had, still logged


# ---- reward-hacking probes --------------------------------------------------------------------
CANDIDATES = "Ora Lind, Ari Voss, Tam Hale, Ira Quell"


def test_probe_listing_candidates_does_not_pay() -> None:
    listing = r1(QUERY, f"</think><answer>{CANDIDATES}</answer>", answer=CANDIDATES)
    exact, _, _ = R1_CASES["valid"]
    # stage 2's F1 punishes the list (precision 2/8): far below the exact answer
    s2 = recipe("r1searcher_stage2")
    assert s2.score([listing])[0].total == pytest.approx(2 * 0.25 * 1.0 / 1.25)
    # containment metrics pay for lists unless guarded; the guard is on by default
    assert recipe("r1searcher_stage2", "answer.metric=cover_em", "answer.hedge_guard=false").score([listing])[0].total == 1.0
    assert recipe("r1searcher_stage2", "answer.metric=cover_em").score([listing])[0].total == 0.0
    assert recipe("r1searcher_stage2", "answer.metric=acc").score([listing])[0].total == 0.0
    assert recipe("r1searcher_stage2", "answer.metric=cover_em").score([exact])[0].total == 1.0
    # R3-RAG's rule (em) does not count it correct: fate "wrong", no +2
    r3_listing = r3(q(0, "a", ("g1",)), a(1, CANDIDATES))
    assert recipe("r3rag").score([r3_listing])[0].per_step == approx([0.8, 0.0])


def test_probe_or_hedge_does_not_pay_under_cover_em() -> None:
    hedge = r1(QUERY, "</think><answer>Ora Lind or Ari Voss</answer>", answer="Ora Lind or Ari Voss")
    assert recipe("r1searcher_stage2", "answer.metric=cover_em").score([hedge])[0].total == 0.0


def test_probe_repeating_the_query_does_not_pay() -> None:
    once, _, _ = R1_CASES["valid"]
    again = "<|begin_of_query|>Vell birthplace<|end_of_query|>"
    spam = r1(QUERY, again, again, " found</think><answer>Ora Lind</answer>", queries=("Vell birthplace",) * 3)
    stage1 = recipe("r1searcher_stage1")
    assert stage1.score([spam])[0].total == stage1.score([once])[0].total == 1.0
    penalised = recipe("r1searcher_stage1", "retrieval.repeat_penalty=0.2").score([spam])[0]
    assert penalised.total == pytest.approx(0.5 * (1.0 - 0.2 * 2) + 0.5)
    # R3-RAG: re-finding the same gold passage earns no further process reward
    rep, expected = R3_CASES["repeated_query"]
    assert sum(expected[:3]) == pytest.approx(R3_CASES["correct"][1][0])


def test_probe_answer_hidden_in_think_and_text_after_answer_do_not_pay() -> None:
    valid = recipe("r1searcher_stage2").score([R1_CASES["valid"][0]])[0].total
    for case in ("answer_hidden_in_think", "text_after_answer"):
        traj = R1_CASES[case][0]
        assert recipe("r1searcher_stage2").score([traj])[0].total < 0 < valid
        assert recipe("r1searcher_stage1").score([traj])[0].total < 1.0
    after = "The problem analysis: x\nThe final answer: Ora Lind\nor perhaps Ari Voss"
    r3_after = r3(q(0, "a", ("g1",)), a(1, "Ora Lind", raw=after))
    assert recipe("r3rag").score([r3_after])[0].per_step == approx([0.8, -0.9])


# ---- plumbing ---------------------------------------------------------------------------------
def test_summarize_means_every_component() -> None:
    outs = recipe("r1searcher_stage2").score([R1_CASES["valid"][0], R1_CASES["no_answer"][0]])
    summary = summarize(outs)
    assert summary["reward/total"] == pytest.approx((1.0 - 2.0) / 2)
    assert summary["reward/format_valid"] == 0.5 and summary["reward/judge_missing"] == 0.0
    assert isinstance(outs[0], RewardOutput) and outs[0].to_dict()["total"] == 1.0


def test_recipe_errors_are_one_line_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key"):
        load_recipe_config(RECIPES / "r3rag.yaml", ["stepwise.bonus=1"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("shape: outcome\noutcome:\n  terms: [{component: vibes}]\n")
    with pytest.raises(ConfigError, match="vibes"):
        load_recipe_config(bad)
    with pytest.raises(ConfigError, match="no such recipe"):
        load_recipe_config("nope", recipe_dir=tmp_path)
    assert load_recipe_config("r3rag", recipe_dir=RECIPES).name == "r3rag"

"""Formats: parsing, error classes, feedback rendering, the registry, a third format."""

from __future__ import annotations

import pytest
from rollout_helpers import CORPUS, QUESTIONS, tiny_tokenizer

from r3rag.data.records import Passage
from r3rag.errors import ConfigError
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import FORMATS, ParsedTurn, TrajectoryFormat, get_format, register_format
from r3rag.rollout.formats.base import has_runaway_repetition, longest_overlap
from r3rag.rollout.oracle import OracleBackend
from r3rag.testing.fake_retriever import OverlapRetriever

EOS = "<|im_end|>"


def fmt(name: str, mode: str = "chat") -> TrajectoryFormat:
    return get_format(name, mode=mode, tokenizer=tiny_tokenizer())


# ---- R3-RAG steps ------------------------------------------------------------------------------
def test_r3_parses_query_turn():
    t = fmt("r3rag_steps").parse_turn(
        "Step 1:\nThe problem analysis: need the town.\nThe retrieval query: Varnel Oskaro birthplace" + EOS, 0
    )
    assert t == ParsedTurn("need the town.", query="Varnel Oskaro birthplace")


def test_r3_parses_answer_and_strips_raw_stop_marker():
    f = fmt("r3rag_steps", "raw")
    t = f.parse_turn("Step 2:\nThe problem analysis: found.\nThe final answer: Dromel\nmore words", 1)
    assert (t.answer, t.analysis, t.error) == ("Dromel", "found.", None)
    q = f.parse_turn("Step 1:\nThe problem analysis: a\nThe retrieval query: where\nThe retrieval documents:", 0)
    assert (q.query, q.error) == ("where", None)


@pytest.mark.parametrize(
    "text,error",
    [
        ("Step 1:\nThe problem analysis: I am thinking.", "no_marker"),
        ("The retrieval query: x\nThe final answer: y", "query_and_answer"),
        ("Step 1:\nThe problem analysis: a\nThe retrieval query:   \n", "empty_query"),
        ("The final answer: ", "empty_answer"),
        ("Step 1: " + "and then again " * 12, "repetition"),
    ],
)
def test_r3_format_errors(text, error):
    assert fmt("r3rag_steps").parse_turn(text, 0).error == error


# ---- R1-Searcher tags ---------------------------------------------------------------------------
def test_r1_parses_query_and_answer():
    f = fmt("r1searcher_tags", "raw")
    q = f.parse_turn("<think> need the founder <|begin_of_query|> Melvane founder <|end_of_query|>", 0)
    assert q == ParsedTurn("need the founder", query="Melvane founder")
    a = f.parse_turn("so it is Tirra. </think>\n<answer> Tirra Olle </answer>" + EOS, 1)
    assert (a.answer, a.analysis) == ("Tirra Olle", "so it is Tirra.")


@pytest.mark.parametrize(
    "text,error",
    [
        ("<think> just thinking", "no_marker"),
        ("<think> x <|begin_of_query|> founder of", "unterminated_tag"),
        ("<answer> Tirra", "unterminated_tag"),
        ("<answer> a </answer> <|begin_of_query|> b <|end_of_query|>", "query_and_answer"),
        ("<|begin_of_query|>  <|end_of_query|>", "empty_query"),
        ("<think> " + "search more now " * 10, "repetition"),
    ],
)
def test_r1_format_errors(text, error):
    assert fmt("r1searcher_tags", "raw").parse_turn(text, 0).error == error


# ---- rendering ----------------------------------------------------------------------------------
DOCS = [Passage("p1", "Quessa\nQuessa is a town.", 3.0), Passage("p2", "Dromel\nA province.", 2.0)]


def test_chat_feedback_is_the_templates_observation_turn():
    f = fmt("r3rag_steps")
    turn = "Step 1:\nThe problem analysis: a\nThe retrieval query: q" + EOS
    fb = f.feedback_text(turn, DOCS, 0)
    # the model's EOS already closed the assistant turn: the feedback starts after it
    assert fb == (
        "\n<|im_start|>user\n<tool_response>\nThe retrieval documents:\n(1) Quessa: Quessa is a town.\n"
        "(2) Dromel: A province.\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # without the EOS the environment closes the turn itself
    assert f.feedback_text(turn[: -len(EOS)], DOCS, 0) == EOS + fb


def test_raw_feedback_skips_the_marker_the_model_wrote():
    f = fmt("r3rag_steps", "raw")
    wrote = "The retrieval query: q\nThe retrieval documents:"
    assert f.feedback_text(wrote, DOCS[:1], 0) == "\n(1) Quessa: Quessa is a town.\n\n"
    assert f.feedback_text("The retrieval query: q", DOCS[:1], 0) == (
        "\nThe retrieval documents:\n(1) Quessa: Quessa is a town.\n\n"
    )
    r1 = fmt("r1searcher_tags", "raw")
    assert r1.feedback_text("<|end_of_query|>", DOCS[:1], 0) == (
        "\n\n<|begin_of_documents|>\n(1)Quessa Quessa is a town.\n<|end_of_documents|>\n\n"
    )


@pytest.mark.parametrize("name", ["r3rag_steps", "r1searcher_tags"])
@pytest.mark.parametrize("mode", ["chat", "raw"])
def test_render_turn_parses_back(name, mode):
    f = fmt(name, mode)
    q = f.parse_turn(f.render_turn(0, "we need X", query="who made X"), 0)
    assert (q.query, q.analysis, q.error) == ("who made X", "we need X", None)
    a = f.parse_turn(f.render_turn(1, "X was made by Y", answer="Y"), 1)
    assert (a.answer, a.error) == ("Y", None)


def test_stop_strings_per_mode():
    assert "<|end_of_query|>" in fmt("r1searcher_tags").stop
    assert "\nThe retrieval documents:" in fmt("r3rag_steps", "raw").stop


def test_user_template_replaces_packaged_prompt(tmp_path):
    p = tmp_path / "mine.txt"
    p.write_text("Be brief.")
    f = get_format("r3rag_steps", mode="raw", system_prompt_path=str(p))
    assert f.render_prompt("Q?").startswith("Be brief.\n\nThe question: Q?")


def test_registry_unknown_name_and_chat_needs_template():
    with pytest.raises(ConfigError, match="unknown trajectory format 'nope'.*r1searcher_tags"):
        get_format("nope")
    with pytest.raises(ValueError, match="chat template"):
        get_format("r3rag_steps", mode="chat", tokenizer=None)


def test_helpers():
    assert longest_overlap("abc<|im", "<|im_end|>") == 4
    assert longest_overlap("abc", "xyz") == 0
    assert has_runaway_repetition("ok " + "the same words " * 7)
    assert not has_runaway_repetition("Step 1: a normal analysis of the question with a query.")


# ---- a third format, registered in the test only --------------------------------------------------
@register_format("test_search_tags")
class SearchTagsFormat(TrajectoryFormat):
    """Search-R1-style tags: <search> q </search>, <information> docs </information>, <answer>."""

    chat_stop = raw_stop = ("</search>", "</answer>")
    system_template = "r1searcher_tags_system.txt"
    raw_template = "r3rag_steps_raw.txt"
    documents_marker = "<information>"

    def parse_turn(self, text, step_index):
        body = self._strip_end(text)
        for tag, field in (("search", "query"), ("answer", "answer")):
            if f"<{tag}>" in body:
                inner = body.split(f"<{tag}>", 1)[1]
                if f"</{tag}>" not in inner:
                    return ParsedTurn(error="unterminated_tag")
                return ParsedTurn(body.split(f"<{tag}>")[0].strip(), **{field: inner.split(f"</{tag}>")[0].strip()})
        return ParsedTurn(body, error="no_marker")

    def render_turn(self, step_index, analysis, query=None, answer=None):
        if query is not None:
            return f"{analysis} <search> {query} </search>"
        return f"{analysis} <answer> {answer} </answer>" + self.eos_text

    def render_documents(self, documents, step_index):
        return "<information>" + " ".join(p.contents for p in documents) + "</information>"

    def raw_feedback(self, body):
        return "\n" + body + "\n"


def test_third_format_runs_end_to_end_with_no_other_change():
    assert "test_search_tags" in FORMATS
    tok = tiny_tokenizer()
    cfg = RolloutConfig(format="test_search_tags", mode="raw", docs_per_step=2)
    f = get_format("test_search_tags", mode="raw", tokenizer=tok)
    trajs = RolloutEngine(OracleBackend(QUESTIONS[:2], f, tok), OverlapRetriever(CORPUS), cfg).run(QUESTIONS[:2])
    assert [t.answer for t in trajs] == ["Dromel", "Tirra Olle"]
    assert trajs[0].steps[0].query == "Where was Varnel Oskaro born?"
    assert "<information>" in trajs[0].text


@pytest.mark.parametrize("name", ["r3rag_steps", "r1searcher_tags"])
def test_prompt_variant_fewshot_adds_a_worked_example(name):
    tok = tiny_tokenizer()
    standard = get_format(name, mode="chat", tokenizer=tok)
    fewshot = get_format(name, mode="chat", tokenizer=tok, prompt_variant="fewshot")
    assert "Example." in fewshot.system_prompt and "Example." not in standard.system_prompt
    assert fewshot.stop == standard.stop  # only the instructions differ
    with pytest.raises(ValueError, match="prompt_variant"):
        get_format(name, mode="chat", tokenizer=tok, prompt_variant="chatty")

"""R1-Searcher's tag format: reasoning in ``<think>``, queries in ``<|begin_of_query|>`` tags.

The model reasons and, when it needs a fact, writes ``<|begin_of_query|> keywords
<|end_of_query|>``; generation stops at the closing tag (kept in the output), the environment
inserts ``<|begin_of_documents|>\\n(1)...\\n<|end_of_documents|>`` and the model continues. The
answer goes in ``<answer> ... </answer>``. In raw mode the documents are inline (as in the
original); in chat mode they are an observation turn and each continuation is a new assistant
turn, so SFT data renders them identically.
"""

from __future__ import annotations

from r3rag.data.records import Passage
from r3rag.rollout.formats.base import ParsedTurn, TrajectoryFormat, has_runaway_repetition
from r3rag.rollout.formats.r1searcher_tags_rules import check_r1searcher
from r3rag.rollout.formats.registry import register_format

BEGIN_QUERY, END_QUERY = "<|begin_of_query|>", "<|end_of_query|>"
BEGIN_DOCS, END_DOCS = "<|begin_of_documents|>", "<|end_of_documents|>"
BEGIN_ANSWER, END_ANSWER = "<answer>", "</answer>"
THINK, END_THINK = "<think>", "</think>"


@register_format("r1searcher_tags")
class R1SearcherTagsFormat(TrajectoryFormat):
    chat_stop = (END_QUERY, END_ANSWER)
    raw_stop = (END_QUERY, END_ANSWER)
    system_template = "r1searcher_tags_system.txt"
    raw_template = "r1searcher_tags_raw.txt"
    documents_marker = BEGIN_DOCS
    #: the format's rules (rewards): see :mod:`r3rag.rollout.formats.r1searcher_tags_rules`
    format_violations = staticmethod(check_r1searcher)

    def parse_turn(self, text: str, step_index: int) -> ParsedTurn:
        body = self._strip_end(text)
        if has_runaway_repetition(body):
            return ParsedTurn(analysis=body, error="repetition")
        q0, a0 = body.find(BEGIN_QUERY), body.find(BEGIN_ANSWER)
        first = min(p for p in (q0, a0, len(body)) if p >= 0)
        analysis = body[:first].replace(THINK, "").replace(END_THINK, "").strip()
        if q0 >= 0 and a0 >= 0:
            return ParsedTurn(analysis, error="query_and_answer")
        if q0 < 0 and a0 < 0:
            if END_QUERY in body or END_ANSWER in body:
                return ParsedTurn(analysis, error="unterminated_tag")
            return ParsedTurn(analysis, error="no_marker")
        start, end_tag, begin = (q0, END_QUERY, BEGIN_QUERY) if q0 >= 0 else (a0, END_ANSWER, BEGIN_ANSWER)
        close = body.find(end_tag, start)
        if close < 0:
            return ParsedTurn(analysis, error="unterminated_tag")
        value = body[start + len(begin):close].strip()
        if begin == BEGIN_QUERY:
            return ParsedTurn(analysis, query=value) if value else ParsedTurn(analysis, error="empty_query")
        return ParsedTurn(analysis, answer=value) if value else ParsedTurn(analysis, error="empty_answer")

    def render_turn(self, step_index: int, analysis: str, query: str | None = None, answer: str | None = None) -> str:
        think = f"{THINK} {analysis} " if step_index == 0 or self.mode == "chat" else f"{analysis} "
        if query is not None:
            return think + f"{BEGIN_QUERY} {query} {END_QUERY}"
        # a model is stopped at </answer> (a stop string), so the turn ends there
        return think + f"{END_THINK}\n{BEGIN_ANSWER} {answer} {END_ANSWER}"

    def render_documents(self, documents: list[Passage], step_index: int) -> str:
        lines = [f"({i + 1}){p.contents.replace(chr(10), ' ', 1)}" for i, p in enumerate(documents)]
        return BEGIN_DOCS + "\n" + "\n".join(lines) + ("\n" if lines else "") + END_DOCS

    def raw_feedback(self, body: str) -> str:
        return "\n\n" + body + "\n\n"

"""R3-RAG's step format: one ``Step N:`` per model turn, plain-text markers.

A turn reads::

    Step 2:
    The problem analysis: <analysis>
    The retrieval query: <query>          (or)   The final answer: <answer>

and the environment answers a query with ``The retrieval documents:`` followed by numbered
passages. In raw mode the turn is stopped at ``\\nThe retrieval documents:`` (which the model
often writes itself) or at a runaway ``\\nStep `` and the feedback skips whatever part of the
marker the model already wrote.
"""

from __future__ import annotations

import re

from r3rag.data.records import Passage
from r3rag.rollout.formats.base import ParsedTurn, TrajectoryFormat, has_runaway_repetition
from r3rag.rollout.formats.r3rag_steps_rules import check_r3rag
from r3rag.rollout.formats.registry import register_format

ANALYSIS = "The problem analysis:"
QUERY = "The retrieval query:"
ANSWER = "The final answer:"
DOCUMENTS = "The retrieval documents:"
_STEP_RE = re.compile(r"^\s*Step\s*\d+\s*:\s*", re.IGNORECASE)


def render_passage(i: int, p: Passage) -> str:
    title, text = p.title, p.text
    return f"({i}) {title}: {text}" if text else f"({i}) {title}"


@register_format("r3rag_steps")
class R3RagStepsFormat(TrajectoryFormat):
    chat_stop = ("\n" + DOCUMENTS, "\nStep ")
    raw_stop = ("\n" + DOCUMENTS, "\nStep ")
    system_template = "r3rag_steps_system.txt"
    raw_template = "r3rag_steps_raw.txt"
    documents_marker = DOCUMENTS
    #: the format's rules (rewards): see :mod:`r3rag.rollout.formats.r3rag_steps_rules`
    format_violations = staticmethod(check_r3rag)

    def parse_turn(self, text: str, step_index: int) -> ParsedTurn:
        body = self._strip_end(text)
        for tail in (DOCUMENTS, "\nStep"):
            if body.endswith(tail):
                body = body[: -len(tail)].rstrip()
        if has_runaway_repetition(body):
            return ParsedTurn(analysis=body, error="repetition")
        body = _STEP_RE.sub("", body, count=1)
        qpos, apos = body.find(QUERY), body.find(ANSWER)
        if qpos >= 0 and apos >= 0:
            return ParsedTurn(analysis=self._analysis(body, min(qpos, apos)), error="query_and_answer")
        if qpos < 0 and apos < 0:
            return ParsedTurn(analysis=self._analysis(body, len(body)), error="no_marker")
        pos, marker = (qpos, QUERY) if qpos >= 0 else (apos, ANSWER)
        value = _first_line(body[pos + len(marker):])
        analysis = self._analysis(body, pos)
        if marker == QUERY:
            return ParsedTurn(analysis, query=value) if value else ParsedTurn(analysis, error="empty_query")
        return ParsedTurn(analysis, answer=value) if value else ParsedTurn(analysis, error="empty_answer")

    @staticmethod
    def _analysis(body: str, end: int) -> str:
        head = body[:end]
        i = head.find(ANALYSIS)
        return (head[i + len(ANALYSIS):] if i >= 0 else head).strip()

    def render_turn(self, step_index: int, analysis: str, query: str | None = None, answer: str | None = None) -> str:
        text = f"Step {step_index + 1}:\n{ANALYSIS} {analysis}\n"
        if query is not None:
            # chat: the turn ends with EOS; raw: the model writes the documents marker and is stopped there
            return text + f"{QUERY} {query}" + (self.eos_text if self.mode == "chat" else "\n" + DOCUMENTS)
        return text + f"{ANSWER} {answer}" + self.eos_text

    def render_documents(self, documents: list[Passage], step_index: int) -> str:
        lines = [render_passage(i + 1, p) for i, p in enumerate(documents)] or ["(no documents found)"]
        return DOCUMENTS + "\n" + "\n".join(lines)

    def raw_feedback(self, body: str) -> str:
        return "\n" + body + "\n\n"


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""

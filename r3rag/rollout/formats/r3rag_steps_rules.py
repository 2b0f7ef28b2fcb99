"""The rules of R3-RAG's step format, checked on exactly what the model wrote.

The checks read the model's own text (``Step.raw``, or the trajectory's ``model`` segments) and
never the parser's internals; a parser-reported ``Step.format_error`` is added as
``parser_<name>``. One model turn per step; a leading ``Step N:`` and a trailing
``The retrieval documents:`` or ``Step`` stop string or end-of-turn token are allowed.

Step rules: ``missing_analysis``, ``multiple_analyses``, ``no_action`` (neither query nor
answer), ``query_and_answer``, ``multiple_queries``, ``multiple_answers``, ``empty_query``,
``empty_answer``, ``action_before_analysis``, ``multiple_steps`` (ran on into the next step),
``wrote_documents`` (the model invented the environment's documents), ``text_after_answer``
(anything on the lines after ``The final answer: ...``), ``answer_too_long``; trajectory rules:
``step_after_answer``, ``no_steps`` and, with ``FormatConfig.require_answer``, ``no_answer`` (no step
gave a final answer: the chain ran out of steps or tokens, or stopped at a broken step).
"""

from __future__ import annotations

import re
from typing import Any

from r3rag.rollout.formats.rules import FormatConfig, Violation, strip_end, word_count

_STEP = re.compile(r"Step\s*\d+\s*:", re.IGNORECASE)
_ANALYSIS = re.compile(r"The problem analysis\s*:", re.IGNORECASE)
_QUERY = re.compile(r"The retrieval query\s*:", re.IGNORECASE)
_ANSWER = re.compile(r"The final answer\s*:", re.IGNORECASE)
_DOCS = re.compile(r"The retrieval documents\s*:", re.IGNORECASE)
_DOCS_MARKER = "The retrieval documents:"


def _step_raws(traj: Any) -> list[str]:
    if any(s.raw for s in traj.steps):
        return [s.raw for s in traj.steps]
    model = [s.text for s in traj.segments if s.role == "model"]
    return [model[i] if i < len(model) else "" for i in range(len(traj.steps))]


def r3rag_step_violations(raw: str, cfg: FormatConfig) -> list[str]:
    """Named rule breaks of one R3-RAG step's raw model text.

    >>> r3rag_step_violations("Step 1:\\nThe problem analysis: need X.\\nThe retrieval query: X", FormatConfig())
    []
    >>> r3rag_step_violations("The final answer: A\\nThe final answer: B", FormatConfig())
    ['missing_analysis', 'multiple_answers']
    """
    text = strip_end(raw, [*cfg.end_markers, _DOCS_MARKER, "Step"]).strip()  # the turn's stop strings
    out: list[str] = []
    lead = _STEP.match(text)
    body = text[lead.end() :] if lead else text
    if _STEP.search(body):
        out.append("multiple_steps")
    analyses = list(_ANALYSIS.finditer(body))
    queries = list(_QUERY.finditer(body))
    answers = list(_ANSWER.finditer(body))
    if not analyses:
        out.append("missing_analysis")
    elif len(analyses) > 1:
        out.append("multiple_analyses")
    if _DOCS.search(body):
        out.append("wrote_documents")
    if not queries and not answers:
        out.append("no_action")
        return out
    if queries and answers:
        out.append("query_and_answer")
    if len(queries) > 1:
        out.append("multiple_queries")
    if len(answers) > 1:
        out.append("multiple_answers")
    first_action = min(m.start() for m in (*queries, *answers))
    if analyses and analyses[0].start() > first_action:
        out.append("action_before_analysis")
    if queries:
        query = _cut_at_markers(body[queries[0].end() :])
        if not query.strip():
            out.append("empty_query")
    if answers:
        rest = _cut_at_markers(body[answers[0].end() :]).strip()  # the answer is its first non-empty line
        first_line, _, after = rest.partition("\n")
        if not first_line.strip():
            out.append("empty_answer")
        if after.strip():
            out.append("text_after_answer")
        if cfg.max_answer_words is not None and word_count(first_line) > cfg.max_answer_words:
            out.append("answer_too_long")
    return out


def _cut_at_markers(text: str) -> str:
    """Text up to the next R3-RAG marker (so a second marker is not read as content)."""
    cut = len(text)
    for rx in (_STEP, _ANALYSIS, _QUERY, _ANSWER, _DOCS):
        m = rx.search(text)
        if m:
            cut = min(cut, m.start())
    return text[:cut]


def check_r3rag(traj: Any, cfg: FormatConfig) -> list[Violation]:
    if not traj.steps:
        return [Violation("no_steps")]
    out: list[Violation] = []
    answered_at: int | None = None
    for i, (step, raw) in enumerate(zip(traj.steps, _step_raws(traj))):
        names = r3rag_step_violations(raw, cfg)
        if step.format_error:
            names.append(f"parser_{step.format_error}")
        if answered_at is not None:
            names.append("step_after_answer")
        if step.answer is not None and answered_at is None:
            answered_at = i
        out.extend(Violation(n, i) for n in dict.fromkeys(names))
    if cfg.require_answer and answered_at is None:
        out.append(Violation("no_answer"))
    return out

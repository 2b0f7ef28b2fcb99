"""Format validity: each trajectory format's rules, checked on exactly what the model wrote.

The checks read the model's own text (``Step.raw``, or the trajectory's ``model`` segments) and
never the rollout parser's internals; a parser-reported ``Step.format_error`` is added as
``parser_<name>``. Each broken rule is a named :class:`Violation`, attached to a step where the
format has steps (R3-RAG) or to the whole trajectory (R1-Searcher's single tagged generation).

R3-RAG step rules (one model turn per step; a leading ``Step N:`` and a trailing
``The retrieval documents:`` or ``Step`` stop string or end-of-turn token are allowed; the rollout
engine's names ``r3rag_steps`` and ``r1searcher_tags`` are aliases of ``r3rag`` and ``r1searcher``):
``missing_analysis``, ``multiple_analyses``, ``no_action`` (neither query nor answer),
``query_and_answer``, ``multiple_queries``, ``multiple_answers``, ``empty_query``,
``empty_answer``, ``action_before_analysis``, ``multiple_steps`` (ran on into the next step),
``wrote_documents`` (the model invented the environment's documents), ``text_after_answer``
(anything on the lines after ``The final answer: ...``), ``answer_too_long``, and at trajectory
level ``step_after_answer`` and ``no_steps``.

R1-Searcher tag rules (``<think>``, ``<|begin_of_query|>``, ``<answer>``; queries may sit inside
the think block): ``unbalanced_<tag>`` (a tag opened and not closed, closed and not opened, or
nested in itself), ``no_answer``, ``multiple_answers``, ``empty_answer``, ``answer_too_long``
(more than ``max_answer_words`` words), ``query_in_answer``, ``answer_in_think`` (an answer
hidden in the reasoning; it does not count as an answer), ``text_after_answer``, ``empty_query``, ``wrote_documents``, and
``no_think`` when ``require_think`` is set.

>>> from r3rag.rollout.trajectory import Trajectory, Segment
>>> t = Trajectory("q", "Who?", "r1searcher", segments=[Segment("model", "<think>x</think><answer>A</answer> ok", [])])
>>> [v.name for v in format_violations(t, FormatConfig())]
['text_after_answer']
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from r3rag.config import Section
from r3rag.rollout.trajectory import Trajectory

DEFAULT_END_MARKERS = ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<|end|>"]


class FormatConfig(Section):
    """Format rules that vary by recipe."""

    max_answer_words: int | None = None  # R1-Searcher stage 2: 10
    require_think: bool = False
    end_markers: list[str] = DEFAULT_END_MARKERS


@dataclass(frozen=True)
class Violation:
    """A broken format rule; ``step`` is the 0-based position in ``Trajectory.steps`` (None: whole trajectory)."""

    name: str
    step: int | None = None

    def __str__(self) -> str:
        return self.name if self.step is None else f"step{self.step + 1}:{self.name}"


@lru_cache(maxsize=64)
def _tail_pattern(markers: tuple[str, ...]) -> re.Pattern[str]:
    alts = "|".join(re.escape(m) for m in sorted(set(markers), key=len, reverse=True) if m)
    return re.compile(rf"(?:\s|{alts})+\Z" if alts else r"\s+\Z")


def _strip_end(text: str, markers: Sequence[str], extra: Sequence[str] = ()) -> str:
    """``text`` without trailing whitespace and end-of-turn / stop strings (any number, any order)."""
    return _tail_pattern(tuple(markers) + tuple(extra)).sub("", text)


def model_text(traj: Trajectory) -> str:
    """Everything the policy wrote: the ``model`` segments, else the steps' raw text."""
    parts = [s.text for s in traj.segments if s.role == "model"]
    return "".join(parts) if parts else "".join(s.raw for s in traj.steps)


def _word_count(text: str) -> int:
    return len(text.split())


# ---- R3-RAG step format -----------------------------------------------------------------------
_STEP = re.compile(r"Step\s*\d+\s*:", re.IGNORECASE)
_ANALYSIS = re.compile(r"The problem analysis\s*:", re.IGNORECASE)
_QUERY = re.compile(r"The retrieval query\s*:", re.IGNORECASE)
_ANSWER = re.compile(r"The final answer\s*:", re.IGNORECASE)
_DOCS = re.compile(r"The retrieval documents\s*:", re.IGNORECASE)
_DOCS_MARKER = "The retrieval documents:"


def _step_raws(traj: Trajectory) -> list[str]:
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
    text = _strip_end(raw, cfg.end_markers, [_DOCS_MARKER, "Step"]).strip()  # the turn's stop strings
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
        if cfg.max_answer_words is not None and _word_count(first_line) > cfg.max_answer_words:
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


def check_r3rag(traj: Trajectory, cfg: FormatConfig) -> list[Violation]:
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
    return out


# ---- R1-Searcher tag format -------------------------------------------------------------------
_TAGS = {
    "<think>": ("think", True),
    "</think>": ("think", False),
    "<|begin_of_query|>": ("query", True),
    "<|end_of_query|>": ("query", False),
    "<answer>": ("answer", True),
    "</answer>": ("answer", False),
    "<|begin_of_documents|>": ("documents", True),
    "<|end_of_documents|>": ("documents", False),
}
_TAG_RX = re.compile("|".join(re.escape(t) for t in _TAGS))


def r1searcher_violations(turns: str | Sequence[str], cfg: FormatConfig) -> list[str]:
    """Named rule breaks of one R1-Searcher generation (the model's text only, one string per turn).

    In chat mode every model turn opens its own ``<think>`` and a query turn stops inside it, so
    at a turn boundary a ``<think>`` left open is closed implicitly when the next turn opens one.

    >>> r1searcher_violations("<think>a<|begin_of_query|>q<|end_of_query|>b</think><answer>Paris</answer>", FormatConfig())
    []
    >>> r1searcher_violations(["<think>a <|begin_of_query|>q<|end_of_query|>", "<think>b</think><answer>Paris</answer>"], FormatConfig())
    []
    >>> r1searcher_violations("<think>it is <answer>Paris</answer></think>", FormatConfig())
    ['answer_in_think', 'no_answer']
    """
    if isinstance(turns, str):
        turns = [turns]
    out: list[str] = []
    stack: list[str] = []  # names of the open tags
    answers: list[str] = []
    after_answer = ""
    for t, turn in enumerate(turns):
        text = _strip_end(turn, cfg.end_markers)
        if t and text.lstrip().startswith("<think>") and stack == ["think"]:
            stack.pop()  # chat mode: the previous turn's think ended with its query
        pos = 0
        open_at: list[int] = []
        for m in _TAG_RX.finditer(text):
            if answers and not stack:
                after_answer += text[pos : m.start()]
            pos = m.end()
            name, opening = _TAGS[m.group(0)]
            if opening:
                if name in stack:
                    out.append(f"unbalanced_{name}")
                if name == "answer" and "think" in stack:
                    out.append("answer_in_think")
                if name == "query" and "answer" in stack:
                    out.append("query_in_answer")
                if name == "documents":
                    out.append("wrote_documents")
                if answers and not stack and name != "answer":
                    after_answer += m.group(0)
                stack.append(name)
                open_at.append(m.end())
                continue
            if not stack or stack[-1] != name:
                out.append(f"unbalanced_{name}")
                if name not in stack:
                    if answers and not stack:
                        after_answer += m.group(0)
                    continue
                while stack[-1] != name:
                    stack.pop()
                    open_at.pop()
            stack.pop()
            start = open_at.pop() if open_at else 0
            content = text[start : m.start()]
            if name == "answer" and "think" not in stack:
                answers.append(_TAG_RX.sub(" ", content).strip())
                after_answer = ""
            elif name == "query" and not content.strip():
                out.append("empty_query")
        if answers and not stack:
            after_answer += text[pos:]
    out.extend(f"unbalanced_{n}" for n in stack)
    if not answers:
        out.append("no_answer")
    else:
        if len(answers) > 1:
            out.append("multiple_answers")
        final = answers[-1]
        if not final:
            out.append("empty_answer")
        if cfg.max_answer_words is not None and _word_count(final) > cfg.max_answer_words:
            out.append("answer_too_long")
        if after_answer.strip():
            out.append("text_after_answer")
    if cfg.require_think and not any("<think>" in turn for turn in turns):
        out.append("no_think")
    return list(dict.fromkeys(out))


def model_turns(traj: Trajectory) -> list[str]:
    """The policy's turns: the ``model`` segments, else each step's raw text."""
    parts = [s.text for s in traj.segments if s.role == "model"]
    return parts if parts else [s.raw for s in traj.steps]


def check_r1searcher(traj: Trajectory, cfg: FormatConfig) -> list[Violation]:
    names = r1searcher_violations(model_turns(traj), cfg)
    names.extend(f"parser_{s.format_error}" for s in traj.steps if s.format_error)
    return [Violation(n) for n in dict.fromkeys(names)]


FORMAT_CHECKERS: dict[str, Callable[[Trajectory, FormatConfig], list[Violation]]] = {
    "r3rag": check_r3rag,
    "r3rag_steps": check_r3rag,  # the rollout engine's registered format names
    "r1searcher": check_r1searcher,
    "r1searcher_tags": check_r1searcher,
}


def format_violations(traj: Trajectory, cfg: FormatConfig) -> list[Violation]:
    """The trajectory's violations under the rules of its own ``format_name``."""
    try:
        checker = FORMAT_CHECKERS[traj.format_name]
    except KeyError:
        raise ValueError(f"no format rules for {traj.format_name!r}; known: {sorted(FORMAT_CHECKERS)}") from None
    return checker(traj, cfg)


def format_validity(trajs: Sequence[Trajectory], cfg: FormatConfig) -> list[float]:
    """1.0 for each trajectory with no violation, else 0.0 (batched)."""
    return [0.0 if format_violations(t, cfg) else 1.0 for t in trajs]

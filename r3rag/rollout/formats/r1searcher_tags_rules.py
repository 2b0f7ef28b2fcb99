"""The rules of R1-Searcher's tag format, checked on exactly what the model wrote.

Tags: ``<think>``, ``<|begin_of_query|>``, ``<answer>`` (queries may sit inside the think
block). Rules, for the whole trajectory (one tagged generation): ``unbalanced_<tag>`` (a tag
opened and not closed, closed and not opened, or nested in itself), ``no_answer``,
``multiple_answers``, ``empty_answer``, ``answer_too_long`` (more than ``max_answer_words``
words), ``query_in_answer``, ``answer_in_think`` (an answer hidden in the reasoning; it does not
count as an answer), ``text_after_answer``, ``empty_query``, ``wrote_documents``, and ``no_think``
when ``require_think`` is set; a parser-reported ``Step.format_error`` is added as
``parser_<name>``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

from r3rag.rollout.formats.rules import FormatConfig, Violation, model_turns, strip_end, word_count

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
        text = strip_end(turn, cfg.end_markers)
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
        if cfg.max_answer_words is not None and word_count(final) > cfg.max_answer_words:
            out.append("answer_too_long")
        if after_answer.strip():
            out.append("text_after_answer")
    if cfg.require_think and not any("<think>" in turn for turn in turns):
        out.append("no_think")
    return list(dict.fromkeys(out))


def check_r1searcher(traj: Any, cfg: FormatConfig) -> list[Violation]:
    names = r1searcher_violations(model_turns(traj), cfg)
    names.extend(f"parser_{s.format_error}" for s in traj.steps if s.format_error)
    return [Violation(n) for n in dict.fromkeys(names)]

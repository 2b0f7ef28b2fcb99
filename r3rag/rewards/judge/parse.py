"""Strict parsing of judge replies: a reply is a score or a verdict, or it is garbage.

The published R3-RAG code crashes when a judge reply holds no score and elsewhere falls back to
a length heuristic. Here a reply is accepted only in the exact shapes the prompts ask for, and
anything else parses to ``None`` (the caller marks the result missing and counts it):

- score replies: a number in [0, 1], optionally prefixed ``Score:`` and followed by a full stop
  (``"0.8"``, ``"Score: 1"``, ``"score = .25."``); ``"1.5"``, ``"0.8 because ..."`` and
  ``"high"`` are garbage;
- verdict replies: ``True`` or ``False`` (any case, optional full stop, optional
  ``Answer:``/``Verdict:`` prefix).

A reasoning model's ``<think>...</think>`` block is removed before parsing.
"""

from __future__ import annotations

import re
from typing import Callable

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_SCORE = re.compile(r"^(?:score\s*[:=]\s*)?(\d+(?:\.\d+)?|\.\d+)\s*\.?$", re.IGNORECASE)
_VERDICT = re.compile(r"^(?:(?:answer|verdict|judgement|judgment)\s*[:=]\s*)?(true|false)\s*\.?$", re.IGNORECASE)


def _clean(reply: str) -> str:
    return _THINK.sub("", reply).strip().strip("*`\"' \n\t")


def parse_score(reply: str) -> float | None:
    """A 0-1 relevance score, or ``None`` when the reply is not exactly that.

    >>> parse_score("0.75"), parse_score("Score: 1."), parse_score("1.2"), parse_score("0.5 I think")
    (0.75, 1.0, None, None)
    """
    m = _SCORE.match(_clean(reply))
    if not m:
        return None
    value = float(m.group(1))
    return value if 0.0 <= value <= 1.0 else None


def parse_verdict(reply: str) -> float | None:
    """1.0 for ``True``, 0.0 for ``False``, ``None`` for anything else.

    >>> parse_verdict("True"), parse_verdict(" false. "), parse_verdict("True, because"), parse_verdict("yes")
    (1.0, 0.0, None, None)
    """
    m = _VERDICT.match(_clean(reply))
    if not m:
        return None
    return 1.0 if m.group(1).lower() == "true" else 0.0


PARSERS: dict[str, Callable[[str], float | None]] = {"score": parse_score, "verdict": parse_verdict}

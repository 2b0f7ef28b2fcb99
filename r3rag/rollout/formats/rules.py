"""What every format's rule checker shares: the settings, the named violation, the end-of-turn rule.

A format's own class says which of its rules a trajectory broke
(:meth:`~r3rag.rollout.formats.base.TrajectoryFormat.format_violations`); the rewards read that
(:func:`r3rag.rewards.format.format_violations`), so a new format is one registered class for the
rollout and the rewards alike.

One rule for the end of a turn, used by the parsers and the checkers: :func:`strip_end` removes
trailing whitespace and end-of-turn / stop strings, any number of them in any order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from r3rag.config import Section

#: end-of-turn texts of the common chat templates (ChatML, Llama 3, GPT-2, Llama 2, Phi)
DEFAULT_END_MARKERS = ["<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>", "<|end|>"]


class FormatConfig(Section):
    """Format rules that vary by recipe."""

    max_answer_words: int | None = None  # R1-Searcher stage 2: 10
    require_think: bool = False
    #: a trajectory that never gave a final answer breaks the format (``no_answer``); R1-Searcher's
    #: tag format always requires one, R3-RAG's steps only with this set (a chain cut off by its
    #: step budget is then invalid, as a tagged generation without ``<answer>`` is)
    require_answer: bool = False
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


def strip_end(text: str, markers: Sequence[str] = ()) -> str:
    """``text`` without trailing whitespace and ``markers`` (any number, any order).

    >>> strip_end("The final answer: Paris<|im_end|>\\n<|im_end|> ", ["<|im_end|>"])
    'The final answer: Paris'
    >>> strip_end("a </s>x", ["</s>"])
    'a </s>x'
    """
    return _tail_pattern(tuple(markers)).sub("", text)


def model_text(traj: Any) -> str:
    """Everything the policy wrote: the ``model`` segments, else the steps' raw text."""
    parts = [s.text for s in traj.segments if s.role == "model"]
    return "".join(parts) if parts else "".join(s.raw for s in traj.steps)


def model_turns(traj: Any) -> list[str]:
    """The policy's turns: the ``model`` segments, else each step's raw text."""
    parts = [s.text for s in traj.segments if s.role == "model"]
    return parts if parts else [s.raw for s in traj.steps]


def word_count(text: str) -> int:
    return len(text.split())

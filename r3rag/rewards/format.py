"""Format validity: each trajectory's rules come from its own format class.

A trajectory's ``format_name`` is the name its format is registered under
(:mod:`r3rag.rollout.formats.registry`: ``r3rag_steps``, ``r1searcher_tags``, ...), and that class's
:meth:`~r3rag.rollout.formats.base.TrajectoryFormat.format_violations` lists the rules it broke, as
named :class:`Violation` s attached to a step where the format has steps (R3-RAG) or to the whole
trajectory (R1-Searcher's single tagged generation). A new format is therefore one registered
class, for the rollout and the rewards alike. The rules themselves live beside each format:
:mod:`r3rag.rollout.formats.r3rag_steps_rules` and :mod:`r3rag.rollout.formats.r1searcher_tags_rules`.

>>> from r3rag.rollout.trajectory import Trajectory, Segment
>>> t = Trajectory("q", "Who?", "r1searcher_tags", segments=[Segment("model", "<think>x</think><answer>A</answer> ok", [])])
>>> [v.name for v in format_violations(t, FormatConfig())]
['text_after_answer']
"""

from __future__ import annotations

from typing import Sequence

from r3rag.rollout.formats import FORMATS
from r3rag.rollout.formats.r1searcher_tags_rules import r1searcher_violations
from r3rag.rollout.formats.r3rag_steps_rules import r3rag_step_violations
from r3rag.rollout.formats.registry import unknown_format_message
from r3rag.rollout.formats.rules import DEFAULT_END_MARKERS, FormatConfig, Violation, model_text, model_turns, strip_end
from r3rag.rollout.trajectory import Trajectory

__all__ = [
    "DEFAULT_END_MARKERS", "FormatConfig", "Violation", "format_validity", "format_violations", "model_text",
    "model_turns", "r1searcher_violations", "r3rag_step_violations", "strip_end",
]


def format_violations(traj: Trajectory, cfg: FormatConfig) -> list[Violation]:
    """The trajectory's violations under the rules of its own ``format_name``."""
    cls = FORMATS.get(traj.format_name)
    if cls is None:
        raise ValueError(unknown_format_message(traj.format_name))
    return cls.format_violations(traj, cfg)


def format_validity(trajs: Sequence[Trajectory], cfg: FormatConfig) -> list[float]:
    """1.0 for each trajectory with no violation, else 0.0 (batched)."""
    return [0.0 if format_violations(t, cfg) else 1.0 for t in trajs]

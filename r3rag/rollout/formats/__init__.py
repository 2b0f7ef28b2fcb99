"""Trajectory formats, by name: ``get_format("r3rag_steps" | "r1searcher_tags", mode=..., tokenizer=...)``."""

from r3rag.rollout.formats.base import FORMAT_ERRORS, ParsedTurn, TrajectoryFormat
from r3rag.rollout.formats.registry import FORMATS, get_format, register_format
from r3rag.rollout.formats import r1searcher_tags as _r1  # noqa: F401  (registers)
from r3rag.rollout.formats import r3rag_steps as _r3  # noqa: F401  (registers)

__all__ = ["FORMATS", "FORMAT_ERRORS", "ParsedTurn", "TrajectoryFormat", "get_format", "register_format"]

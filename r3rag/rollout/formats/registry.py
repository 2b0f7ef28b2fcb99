"""Formats by name: ``@register_format`` on a class, ``get_format(name, ...)`` to build one.

Adding a format is one subclass of :class:`~r3rag.rollout.formats.base.TrajectoryFormat` with
this decorator; the engine, the oracle and the backends need no change.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from r3rag.errors import ConfigError
from r3rag.rollout.formats.base import TrajectoryFormat

F = TypeVar("F", bound=type[TrajectoryFormat])
FORMATS: dict[str, type[TrajectoryFormat]] = {}


def register_format(name: str) -> Callable[[F], F]:
    def deco(cls: F) -> F:
        if name in FORMATS and FORMATS[name] is not cls:
            raise ValueError(f"format {name!r} is already registered by {FORMATS[name].__name__}")
        cls.name = name
        FORMATS[name] = cls
        return cls

    return deco


def get_format(name: str, **kwargs: Any) -> TrajectoryFormat:
    """Build the format registered as ``name`` (kwargs: mode, tokenizer, observation_role, ...)."""
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown trajectory format {name!r}; known: {', '.join(sorted(FORMATS))}") from None
    return cls(**kwargs)

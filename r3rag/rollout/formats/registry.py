"""Formats by name: ``@register_format`` on a class, ``get_format(name, ...)`` to build one.

Adding a format is one subclass of :class:`~r3rag.rollout.formats.base.TrajectoryFormat` with
this decorator; the engine, the oracle, the backends, the evaluation (every format is a method of
the same name) and the rewards (the class's ``format_violations``) need no change. Each format has
exactly one name: the one it is registered under, which its trajectories carry as ``format_name``.
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


def unknown_format_message(name: str) -> str:
    """One line for a name no format is registered under, with the registered names (and the one
    meant, when the given name starts one: ``r3rag`` -> ``r3rag_steps``)."""
    near = [n for n in sorted(FORMATS) if n.startswith(str(name))]
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return f"unknown trajectory format {name!r}{hint}; known: {', '.join(sorted(FORMATS))}"


def get_format(name: str, **kwargs: Any) -> TrajectoryFormat:
    """Build the format registered as ``name`` (kwargs: mode, tokenizer, observation_role, ...)."""
    try:
        cls = FORMATS[name]
    except KeyError:
        raise ConfigError(unknown_format_message(name)) from None
    return cls(**kwargs)

"""Reward components by name: what a recipe's ``outcome.terms`` may refer to.

Each component maps a batch (through the shared :class:`ScoringContext`) to one number per
trajectory. Adding a component is one function and one registry line; recipes pick them by name.

=============  =====================================================================
``answer``     the configured answer metric of the final answer (em, f1, cover_em, acc)
``correct``    1.0 if correct by rule, else by judge (``answer.judge_fallback``); missing -> 0
``format_valid`` 1.0 when the trajectory breaks no format rule
``retrieval``  1 if it searched at least once, minus repeat / over-budget penalties
``relevance``  mean per-step relevance over the query steps (0 when none)
=============  =====================================================================
"""

from __future__ import annotations

from typing import Callable

from r3rag.rewards.context import ScoringContext

Component = Callable[[ScoringContext], list[float]]


def _answer(ctx: ScoringContext) -> list[float]:
    return ctx.answer


def _correct(ctx: ScoringContext) -> list[float]:
    return [c.value or 0.0 for c in ctx.correct]


def _format_valid(ctx: ScoringContext) -> list[float]:
    return [0.0 if v else 1.0 for v in ctx.violations]


def _retrieval(ctx: ScoringContext) -> list[float]:
    return ctx.retrieval


def _relevance(ctx: ScoringContext) -> list[float]:
    out = []
    for rel in ctx.relevance:
        vals = [v for v in rel.values if v is not None]
        out.append(sum(vals) / len(vals) if vals else 0.0)
    return out


COMPONENTS: dict[str, Component] = {
    "answer": _answer,
    "correct": _correct,
    "format_valid": _format_valid,
    "retrieval": _retrieval,
    "relevance": _relevance,
}


def get_component(name: str) -> Component:
    try:
        return COMPONENTS[name]
    except KeyError:
        raise ValueError(f"unknown reward component {name!r}; choose one of {sorted(COMPONENTS)}") from None

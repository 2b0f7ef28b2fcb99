"""The reward object every component and recipe returns.

A reward is more than a number: a trainer needs to know *where* the credit goes (per step, for
R3-RAG's process reward) and a logger needs every *component* separately, so a recipe that
misbehaves can be diagnosed from its curves.

Invariant: ``total == sum(per_step)``; ``per_step`` has one entry per trajectory step (one entry
for a trajectory with no steps), and outcome-only recipes put the whole total on the last entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence


@dataclass
class RewardOutput:
    """One trajectory's reward.

    ``components`` holds named scalars (``outcome``, ``process``, ``format_valid``, ...) for
    logging; ``violations`` the named format violations (``step2:multiple_answers``); ``missing``
    the judge results that could not be obtained (``outcome:timeout``); ``dropped`` is True when
    the judge failure policy is ``drop`` and a needed result was missing: the trainer should leave
    the sample out of the batch, and for a trajectory the infrastructure ended (``backend_error``,
    ``retrieval_failed``) under the recipe's default ``infra_failure: drop``.
    """

    total: float
    per_step: list[float]
    components: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dropped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "per_step": list(self.per_step),
            "components": dict(self.components),
            "violations": list(self.violations),
            "missing": list(self.missing),
            "dropped": self.dropped,
        }


def summarize(outputs: Sequence[RewardOutput]) -> dict[str, float]:
    """Batch means for a logger: ``reward/total``, ``reward/<component>``, counts of missing/dropped.

    >>> a = RewardOutput(1.0, [1.0], {"f1": 1.0})
    >>> b = RewardOutput(-1.0, [-1.0], {"f1": 0.0}, missing=["outcome:timeout"], dropped=True)
    >>> summarize([a, b])
    {'reward/total': 0.0, 'reward/f1': 0.5, 'reward/judge_missing': 1.0, 'reward/infra_failures': 0.0, 'reward/dropped': 1.0}
    """
    if not outputs:
        return {}
    n = len(outputs)
    out: dict[str, float] = {"reward/total": sum(o.total for o in outputs) / n}
    keys: list[str] = []
    for o in outputs:
        keys.extend(k for k in o.components if k not in keys)
    for k in keys:
        vals = [o.components[k] for o in outputs if k in o.components]
        out[f"reward/{k}"] = sum(vals) / len(vals)
    out["reward/judge_missing"] = float(sum(len(o.missing) for o in outputs))
    out["reward/infra_failures"] = float(sum(o.components.get("infra_failure", 0.0) >= 1.0 for o in outputs))
    out["reward/dropped"] = float(sum(o.dropped for o in outputs))
    return out

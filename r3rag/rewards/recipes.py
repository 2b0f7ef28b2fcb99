"""Recipes: a reward is a configuration of components, loaded from ``configs/rewards/*.yaml``.

A recipe picks a *shape* (how components become per-step rewards) and configures the
components. Two shapes cover the published methods:

``stepwise`` (R3-RAG). With ``c`` = 1 if the final answer is correct (rule match, else the
judge) and the fate multiplier ``m`` = ``fate_scale.correct`` (1.6) if correct,
``fate_scale.wrong`` (0.8) if answered wrongly (or the answering step breaks the format),
``fate_scale.no_answer`` (0.9) if it never answered, step ``i`` earns::

    format_error_reward (-0.9)            if step i breaks a format rule (replaces all else)
    relevance_i * m * process_weight      if step i is a query (relevance 0-1: gold or judge)
    correct_reward (2.0) * c              if step i gives the final answer
    0                                     otherwise

``outcome`` (R1-Searcher). ``total = sum(weight_k * component_k)`` over ``outcome.terms``
(components by name, see :mod:`r3rag.rewards.registry`); if ``format_penalty`` is set and the
format is invalid, ``total = format_penalty`` instead. The total sits on the last step.
Stage 1: ``0.5 * retrieval + 0.5 * format_valid``; stage 2: ``answer`` (F1) with penalty -2
(Qwen) or -1 (Llama).

Ablations are one-line changes: ``process.source: off`` (outcome only),
``stepwise.correct_reward: 0`` (process only).

Infrastructure failures are never the policy's: a trajectory that ended in ``backend_error`` or
``retrieval_failed`` is not scored at all. ``infra_failure: drop`` (the default) returns it as
``RewardOutput(0, dropped=True)`` for the trainer to leave out; ``zero`` keeps it in the batch with
reward 0. Either way ``components["infra_failure"]`` is 1 and :func:`~r3rag.rewards.types.summarize`
counts it.

Judge failures follow ``judge.on_failure``: ``zero`` (a missing result counts 0), ``drop``
(the output is marked ``dropped`` for the trainer to skip), ``rule_only`` (outcome: the rule
verdict; process: gold relevance where the question has gold ids, else 0). Every missing result
is named in ``RewardOutput.missing``.

>>> from r3rag.rollout.trajectory import Trajectory, Step, Segment
>>> cfg = RewardConfig(shape="outcome", answer=AnswerConfig(metric="f1", normalization="r1searcher"),
...     outcome=OutcomeConfig(terms=[Term(component="answer")], format_penalty=-2.0))
>>> t = Trajectory("q", "?", "r1searcher_tags", segments=[Segment("model", "<think>x</think><answer>Paris</answer>", [])],
...     steps=[Step(0, answer="Paris")], golden_answers=["Paris"])
>>> RewardScorer(cfg).score([t])[0].total
1.0
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Sequence

from pydantic import field_validator

from r3rag.config import Section, load_config
from r3rag.errors import ConfigError
from r3rag.rewards.answer import AnswerConfig
from r3rag.rewards.context import ScoringContext
from r3rag.rewards.format import FormatConfig
from r3rag.rewards.judge.client import JudgeClient, JudgeConfig
from r3rag.rewards.process import ProcessConfig
from r3rag.rewards.registry import COMPONENTS, get_component
from r3rag.rewards.retrieval import RetrievalConfig, issued_queries
from r3rag.rewards.types import RewardOutput
from r3rag.rollout.trajectory import Trajectory


class FateScale(Section):
    correct: float = 1.6
    wrong: float = 0.8
    no_answer: float = 0.9


class StepwiseConfig(Section):
    correct_reward: float = 2.0
    format_error_reward: float = -0.9
    process_weight: float = 1.0
    fate_scale: FateScale = FateScale()


class Term(Section):
    component: str
    weight: float = 1.0

    @field_validator("component")
    @classmethod
    def _known(cls, name: str) -> str:
        if name not in COMPONENTS:
            raise ValueError(f"unknown reward component {name!r}; choose one of {sorted(COMPONENTS)}")
        return name


class OutcomeConfig(Section):
    terms: list[Term] = [Term(component="answer")]
    format_penalty: float | None = None


class RewardConfig(Section):
    """One recipe. Unknown keys are errors; every number here is a documented knob."""

    name: str = "custom"
    shape: Literal["stepwise", "outcome"] = "stepwise"
    infra_failure: Literal["drop", "zero"] = "drop"
    answer: AnswerConfig = AnswerConfig()
    format: FormatConfig = FormatConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    process: ProcessConfig = ProcessConfig()
    judge: JudgeConfig = JudgeConfig()
    stepwise: StepwiseConfig = StepwiseConfig()
    outcome: OutcomeConfig = OutcomeConfig()


def _missing_flags(missing: list[str], policy: str) -> bool:
    return bool(missing) and policy == "drop"


def assemble_stepwise(ctx: ScoringContext) -> list[RewardOutput]:
    """R3-RAG's per-step rewards (formula in the module docstring)."""
    cfg = ctx.config.stepwise
    policy = ctx.config.judge.on_failure
    process_on = ctx.config.process.source != "off"
    outputs: list[RewardOutput] = []
    for ti, t in enumerate(ctx.trajs):
        n = max(1, len(t.steps))
        violations = ctx.violations[ti]
        bad = {n - 1 if v.step is None else v.step for v in violations}
        corr = ctx.correct[ti]
        missing = [] if corr.value is not None else [f"outcome:{corr.status}"]
        rel = ctx.relevance[ti]
        missing += rel.missing
        answer_step = max((i for i, s in enumerate(t.steps) if s.answer is not None), default=None)
        answer_valid = answer_step is not None and answer_step not in bad
        c = (corr.value or 0.0) if answer_valid else 0.0
        if answer_valid and c >= 1.0:
            fate = cfg.fate_scale.correct
        elif answer_step is not None:
            fate = cfg.fate_scale.wrong
        else:
            fate = cfg.fate_scale.no_answer
        per = [0.0] * n
        outcome = process = fmt = 0.0
        relevances: list[float] = []
        for i in range(n):
            step = t.steps[i] if i < len(t.steps) else None
            if i in bad:
                per[i] = cfg.format_error_reward
                fmt += per[i]
            elif step is not None and step.query is not None:
                r = rel.values[i] if i < len(rel.values) else None
                if process_on:
                    relevances.append(r or 0.0)
                per[i] = (r or 0.0) * fate * cfg.process_weight if process_on else 0.0
                process += per[i]
            elif i == answer_step:
                per[i] = cfg.correct_reward * c
                outcome += per[i]
        components = {
            "outcome": outcome,
            "process": process,
            "format_penalty": fmt,
            "correct": c,
            "fate_scale": fate,
            "relevance_mean": sum(relevances) / len(relevances) if relevances else 0.0,
            "num_format_errors": float(len(bad)),
            "num_retrievals": float(len(issued_queries(t))),
        }
        outputs.append(
            RewardOutput(sum(per), per, components, [str(v) for v in violations], missing, _missing_flags(missing, policy))
        )
    return outputs


def assemble_outcome(ctx: ScoringContext) -> list[RewardOutput]:
    """R1-Searcher's trajectory-level reward, placed on the last step."""
    cfg = ctx.config.outcome
    policy = ctx.config.judge.on_failure
    names = list(dict.fromkeys(term.component for term in cfg.terms))
    table = {name: get_component(name)(ctx) for name in names}
    outputs: list[RewardOutput] = []
    for ti, t in enumerate(ctx.trajs):
        violations = ctx.violations[ti]
        total = sum(term.weight * table[term.component][ti] for term in cfg.terms)
        penalty = 0.0
        if cfg.format_penalty is not None and violations:
            penalty, total = cfg.format_penalty, cfg.format_penalty
        missing: list[str] = []
        if "correct" in names and ctx.correct[ti].value is None:
            missing.append(f"outcome:{ctx.correct[ti].status}")
        if "relevance" in names:
            missing += ctx.relevance[ti].missing
        per = [0.0] * max(1, len(t.steps))
        per[-1] = total
        components = {name: table[name][ti] for name in names}
        components.update(
            format_valid=0.0 if violations else 1.0,
            format_penalty=penalty,
            num_retrievals=float(len(issued_queries(t))),
        )
        outputs.append(
            RewardOutput(total, per, components, [str(v) for v in violations], missing, _missing_flags(missing, policy))
        )
    return outputs


SHAPES: dict[str, Callable[[ScoringContext], list[RewardOutput]]] = {
    "stepwise": assemble_stepwise,
    "outcome": assemble_outcome,
}


class RewardScorer:
    """Scores batches of rollout trajectories (``Trajectory`` objects or their dicts) under one recipe.

    The judge client is created from ``config.judge`` only when the recipe needs one
    (``answer.judge_fallback`` or ``process.source: judge``); pass ``judge`` to share a client.
    """

    def __init__(self, config: RewardConfig, judge: JudgeClient | None = None) -> None:
        self.config = config
        if judge is None and self.needs_judge:
            judge = JudgeClient(config.judge)
        self.judge = judge

    @property
    def needs_judge(self) -> bool:
        return self.config.answer.judge_fallback or self.config.process.source == "judge"

    def score(self, trajs: Sequence[Trajectory | dict[str, Any]]) -> list[RewardOutput]:
        batch = [t if isinstance(t, Trajectory) else Trajectory.from_dict(t) for t in trajs]
        scored = [i for i, t in enumerate(batch) if not t.infra_failed]
        out: list[RewardOutput] = [self._infra_failure(t) for t in batch]
        if scored:
            ctx = ScoringContext([batch[i] for i in scored], self.config, self.judge if self.needs_judge else None)
            for i, o in zip(scored, SHAPES[self.config.shape](ctx)):
                out[i] = o
        return out

    def _infra_failure(self, t: Trajectory) -> RewardOutput:
        """The reward of a trajectory the infrastructure ended: 0, dropped under the default policy."""
        per = [0.0] * max(1, len(t.steps))
        return RewardOutput(0.0, per, {"infra_failure": 1.0}, dropped=self.config.infra_failure == "drop")

    __call__ = score


def component_rewards(
    name: str,
    trajs: Sequence[Trajectory | dict[str, Any]],
    config: RewardConfig | None = None,
    judge: JudgeClient | None = None,
) -> list[RewardOutput]:
    """One component on its own, as reward objects: ``total`` is the component's value, placed on
    the last step, except ``relevance`` whose ``per_step`` holds each query step's relevance
    (``total`` = their sum; ``components["relevance"]`` = their mean, as the component is
    defined). ``config`` supplies the component settings (default: all defaults).

    >>> from r3rag.rollout.trajectory import Trajectory, Step
    >>> t = Trajectory("q", "?", "r3rag_steps", steps=[Step(0, query="a", retrieved=True), Step(1, answer="x")])
    >>> [o.per_step for o in component_rewards("retrieval", [t])]
    [[0.0, 1.0]]
    """
    cfg = config or RewardConfig()
    component = get_component(name)
    if judge is None and (cfg.answer.judge_fallback or cfg.process.source == "judge"):
        judge = JudgeClient(cfg.judge)
    batch = [t if isinstance(t, Trajectory) else Trajectory.from_dict(t) for t in trajs]
    ctx = ScoringContext(batch, cfg, judge)
    values = component(ctx)
    outputs = []
    for ti, (t, value) in enumerate(zip(batch, values)):
        per = [0.0] * max(1, len(t.steps))
        missing: list[str] = []
        if name == "relevance":
            rel = ctx.relevance[ti]
            per = [v or 0.0 for v in rel.values] or [0.0]
            missing = list(rel.missing)
        else:
            per[-1] = value
        if name == "correct" and ctx.correct[ti].value is None:
            missing.append(f"outcome:{ctx.correct[ti].status}")
        violations = [str(v) for v in ctx.violations[ti]] if name == "format_valid" else []
        outputs.append(RewardOutput(sum(per), per, {name: value}, violations, missing))
    return outputs


def resolve_recipe_path(name_or_path: str | Path, recipe_dir: str | Path = "configs/rewards") -> Path:
    """A YAML path as given, or ``<recipe_dir>/<name>.yaml`` for a bare recipe name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    candidate = Path(recipe_dir) / f"{name_or_path}.yaml"
    if candidate.is_file():
        return candidate
    raise ConfigError(f"{name_or_path}: no such recipe file (also looked for {candidate})")


def load_recipe_config(
    name_or_path: str | Path, overrides: Iterable[str] = (), recipe_dir: str | Path = "configs/rewards"
) -> RewardConfig:
    return load_config(RewardConfig, resolve_recipe_path(name_or_path, recipe_dir), overrides)


def load_recipe(
    name_or_path: str | Path,
    overrides: Iterable[str] = (),
    judge: JudgeClient | None = None,
    recipe_dir: str | Path = "configs/rewards",
) -> RewardScorer:
    """Load a recipe YAML (plus ``key=value`` overrides) into a configured :class:`RewardScorer`."""
    return RewardScorer(load_recipe_config(name_or_path, overrides, recipe_dir), judge)

"""Evaluation methods by name: each turns a batch of questions into trajectories.

===================  ============================================================================
``direct``           the model answers from its own knowledge (no retrieval)
``rag``              standard RAG: top-``k`` passages for the question in the prompt, then one answer
``ircot``            iterative retrieve-and-reason: each chain-of-thought sentence is the next query
``r3rag_steps``      R3-RAG's ``Step N:`` format through the rollout engine (trained or prompted models)
``r1searcher_tags``  R1-Searcher's tag format through the rollout engine
``oracle``           the embedded world's gold-decomposition policy (no model; needs world questions)
===================  ============================================================================

Every registered trajectory format (:mod:`r3rag.rollout.formats.registry`) is a method of the same
name: a format has one name everywhere (rollout config, trajectories, rewards, evaluation).
A method is built by :func:`build_method` *after* the dataset has been validated, because
building one loads the model. Adding a method is one factory in :data:`METHODS`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable

from r3rag.data.records import Question
from r3rag.errors import ConfigError
from r3rag.evaluation.baselines import BASELINES, PromptedBaseline
from r3rag.evaluation.components import load_backend, load_retriever
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.datasets import ResolvedDataset
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import FORMATS
from r3rag.rollout.trajectory import Trajectory


class Method(ABC):
    name: str = ""

    @abstractmethod
    async def arun(self, questions: list[Question]) -> list[Trajectory]:
        """One trajectory per question, in input order."""

    async def aclose(self) -> None:
        close = getattr(getattr(self, "retriever", None), "aclose", None)
        if close is not None:
            await close()


class BaselineMethod(Method):
    def __init__(self, runner: PromptedBaseline) -> None:
        self.name = runner.name
        self.runner = runner
        self.retriever = runner.retriever

    async def arun(self, questions: list[Question]) -> list[Trajectory]:
        return await self.runner.arun(questions)


class EngineMethod(Method):
    """A trajectory format (or the oracle) through :class:`RolloutEngine`, one sample per question."""

    def __init__(self, name: str, engine: RolloutEngine) -> None:
        self.name = name
        self.engine = engine
        self.retriever = engine.retriever

    async def arun(self, questions: list[Question]) -> list[Trajectory]:
        # one fixed run seed: a question's sampling never depends on which chunk it ran in (resume)
        trajs = await self.engine.arun(questions, n_samples=1, seed=self.engine.config.seed)
        for t in trajs:
            t.metadata["method"] = self.name
        return trajs


def _baseline(name: str) -> Callable[[EvaluationConfig, ResolvedDataset], Method]:
    def build(cfg: EvaluationConfig, dataset: ResolvedDataset) -> Method:
        spec = BASELINES[name]
        retriever = load_retriever(cfg.retriever, dataset) if spec.initial_retrieval else None
        backend = load_backend(cfg.model)
        return BaselineMethod(PromptedBaseline(name, spec, backend, retriever, cfg.method, cfg.rollout))

    return build


def _format(name: str) -> Callable[[EvaluationConfig, ResolvedDataset], Method]:
    """The registered trajectory format ``name`` as a method of the same name."""

    def build(cfg: EvaluationConfig, dataset: ResolvedDataset) -> Method:
        retriever = load_retriever(cfg.retriever, dataset)
        backend = load_backend(cfg.model)
        rollout = cfg.rollout.model_copy(update={"format": name, "n_samples": 1})
        return EngineMethod(name, RolloutEngine(backend, retriever, rollout))

    return build


def _oracle(cfg: EvaluationConfig, dataset: ResolvedDataset) -> Method:
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.oracle import OracleBackend

    missing = [q.id for q in dataset.questions if not q.metadata.get("decomposition")]
    if missing:
        raise ConfigError(
            f"method oracle needs questions with a gold decomposition (the embedded world); "
            f"{len(missing)} of {len(dataset.questions)} have none (first: {missing[0]!r})"
        )
    retriever = load_retriever(cfg.retriever, dataset)
    tokenizer = _oracle_tokenizer(cfg)
    rollout = cfg.rollout.model_copy(update={"format": cfg.method.oracle_format, "n_samples": 1})
    fmt = get_format(rollout.format, mode=rollout.mode, tokenizer=tokenizer, observation_role=rollout.observation_role)
    backend = OracleBackend(dataset.questions, fmt, tokenizer)
    return EngineMethod("oracle", RolloutEngine(backend, retriever, rollout, fmt=fmt))


def _oracle_tokenizer(cfg: EvaluationConfig):  # type: ignore[no-untyped-def]
    """The oracle writes text, so any tokenizer with a chat template will do: the model's when
    ``model.tokenizer`` is set, else the library's built-in one (built offline in a second)."""
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.tiny_tokenizer import TINY_TOKENIZER

    return load_tokenizer(cfg.model.tokenizer or TINY_TOKENIZER)


METHODS: dict[str, Callable[[EvaluationConfig, ResolvedDataset], Method]] = {
    **{name: _baseline(name) for name in BASELINES},
    **{name: _format(name) for name in FORMATS},
    "oracle": _oracle,
}


def check_method(name: str) -> None:
    if name not in METHODS:
        near = [m for m in METHODS if m.startswith(name)] if name else []
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"unknown method {name!r}{hint}; choose one of {', '.join(METHODS)}")


def build_method(cfg: EvaluationConfig, dataset: ResolvedDataset) -> Method:
    """Load the model and retriever of ``cfg.method.name`` (call after the dataset is validated)."""
    check_method(cfg.method.name)
    return METHODS[cfg.method.name](cfg, dataset)

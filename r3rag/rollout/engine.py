"""The batched multi-turn rollout engine: drives many :class:`~r3rag.rollout.env.RetrievalEnv`.

The turn rules (parsing, stop rules, document selection, rendering, token budgets) live in the
per-trajectory environment, :mod:`r3rag.rollout.env`; the engine only batches. For a batch of
questions x ``n_samples`` (one env each), a *round* is:

1. ask every live env for its next :class:`GenerationRequest` and generate them all in one backend
   call (a request with no budget left is not sent: it gets an empty ``length`` output);
2. give each output to its env (:meth:`RetrievalEnv.record_turn`), which records it and says
   whether a query now waits for documents;
3. send every waiting query of the round, de-duplicated, in ONE ``retriever.asearch`` call and give
   each env its documents; a failed call (after the client's own retries) fails exactly the
   trajectories whose queries were in it (``retrieval_failed``).

An env may start with a query already waiting (standard RAG searches with the question before
the first turn); :func:`drive` serves those first. :func:`drive` is also what the prompted
evaluation baselines run on, with their own env class.

Finished trajectories are yielded as soon as their round ends (:meth:`RolloutEngine.astream`),
optionally written to JSONL. Nothing raises for model output, backend or retrieval problems: each
ends as a stop reason from :data:`r3rag.rollout.trajectory.STOP_REASONS`.

Seeds: every call of :meth:`RolloutEngine.astream` / :meth:`~RolloutEngine.arun` draws fresh
sampling seeds (``config.seed`` + the number of earlier calls) unless the caller passes ``seed``
(a trainer passes its iteration); within a call a trajectory's seed depends on its question id
and sample index, never on its position in the batch.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Protocol, Sequence

from r3rag.data.records import Passage, Question
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.backends.shared_prefix import SENTINELS, shared_prefix_len
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.env import RetrievalEnv
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.formats.registry import get_format
from r3rag.rollout.io import JsonlWriter
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.tokens import encode
from r3rag.rollout.trajectory import Segment, Step, Trajectory


@dataclass
class EngineStats:
    """Where the time went (seconds) and how many calls were made."""

    rounds: int = 0
    generate_s: float = 0.0
    retrieve_s: float = 0.0
    other_s: float = 0.0
    retrieval_calls: int = 0
    queries: int = 0
    generated_tokens: int = 0

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


class Env(Protocol):
    """What :func:`drive` needs of an episode (:class:`RetrievalEnv` is the main one)."""

    trajectory: Trajectory
    pending: Step | None

    @property
    def done(self) -> bool: ...
    def request(self, shared_prefix: int = 0) -> GenerationRequest: ...
    def record_turn(self, out: GenerationOutput) -> Step | None: ...
    def retrieval_k(self) -> int: ...
    def insert_documents(self, found: list[Passage]) -> Segment | None: ...
    def fail_retrieval(self, error: str) -> None: ...


async def drive(
    envs: Sequence[Env],
    backend: PolicyBackend,
    retriever: Retriever | None,
    stats: EngineStats | None = None,
    on_step: Callable[[Trajectory, Step], None] | None = None,
    shared_prefix: int = 0,
) -> AsyncIterator[Env]:
    """Run episodes in rounds (module docstring); yield each env as soon as it is done."""
    stats = stats if stats is not None else EngineStats()
    active = list(envs)
    waiting = [e for e in active if e.pending is not None and not e.done]
    if waiting:
        t0 = time.perf_counter()
        await _retrieve(waiting, retriever, stats)
        stats.retrieve_s += time.perf_counter() - t0
    while active:
        t0 = time.perf_counter()
        live = [e for e in active if not e.done]
        if live:
            stats.rounds += 1
            reqs = [e.request(shared_prefix) for e in live]
            t1 = time.perf_counter()
            outs = await _generate(backend, reqs)
            t2 = time.perf_counter()
            stats.generate_s += t2 - t1
            stats.generated_tokens += sum(len(o.token_ids) for o in outs)
            to_retrieve = []
            for e, out in zip(live, outs):
                if e.record_turn(out) is not None:
                    to_retrieve.append(e)
                elif on_step is not None and e.trajectory.steps:
                    on_step(e.trajectory, e.trajectory.steps[-1])
            t3 = time.perf_counter()
            if to_retrieve:
                await _retrieve(to_retrieve, retriever, stats)
                if on_step is not None:
                    for e in to_retrieve:
                        on_step(e.trajectory, e.trajectory.steps[-1])
            t4 = time.perf_counter()
            stats.retrieve_s += t4 - t3
            stats.other_s += (t1 - t0) + (t3 - t2)
        still = []
        for e in active:
            if e.done:
                yield e
            else:
                still.append(e)
        active = still


async def _generate(backend: PolicyBackend, reqs: list[GenerationRequest]) -> list[GenerationOutput]:
    """One backend call for every request with budget left; a raising backend fails them all."""
    todo = [i for i, r in enumerate(reqs) if r.params.max_tokens > 0]
    outs = [GenerationOutput([], "", None, "length") for _ in reqs]
    if not todo:
        return outs
    try:
        got = await backend.agenerate([reqs[i] for i in todo])
        if len(got) != len(todo):
            raise RuntimeError(f"backend returned {len(got)} outputs for {len(todo)} requests")
    except Exception as err:  # noqa: BLE001 - nothing raises out of the engine
        got = [GenerationOutput([], "", None, "error", error=f"{type(err).__name__}: {err}") for _ in todo]
    for i, o in zip(todo, got):
        outs[i] = o
    return outs


async def _retrieve(envs: list[Env], retriever: Retriever | None, stats: EngineStats) -> None:
    """One retrieval call for the queries of ``envs`` (de-duplicated); each env gets its documents."""
    unique: dict[str, int] = {}
    for e in envs:
        assert e.pending is not None and e.pending.query is not None
        unique.setdefault(e.pending.query, len(unique))
    k = max(e.retrieval_k() for e in envs)
    stats.retrieval_calls += 1
    stats.queries += len(unique)
    try:
        if retriever is None:
            raise RuntimeError("no retriever configured")
        results = await retriever.asearch(list(unique), k)
        if len(results) != len(unique):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(unique)} queries")
    except Exception as err:  # noqa: BLE001 - RetrievalError, timeouts, bad replies: all end the same way
        for e in envs:
            e.fail_retrieval(f"{type(err).__name__}: {err}")
        return
    for e in envs:
        assert e.pending is not None and e.pending.query is not None
        e.insert_documents(results[unique[e.pending.query]])


class RolloutEngine:
    """Run trajectories for questions with a backend, a format and a retriever."""

    def __init__(
        self,
        backend: PolicyBackend,
        retriever: Retriever,
        config: RolloutConfig | None = None,
        fmt: TrajectoryFormat | None = None,
        on_step: Callable[[Trajectory, Step], None] | None = None,
    ) -> None:
        """``on_step(trajectory, step)`` is called once each step is complete: a query step after its
        documents were inserted (or retrieval failed), any other step right after the model's turn.
        The demo streams cards from it."""
        self.backend = backend
        self.on_step = on_step
        self.retriever = retriever
        self.config = config or RolloutConfig()
        self.tokenizer = backend.tokenizer
        c = self.config
        self.fmt = fmt or get_format(
            c.format,
            mode=c.mode,
            tokenizer=self.tokenizer,
            observation_role=c.observation_role,
            system_prompt_path=c.system_prompt_path,
            raw_prompt_path=c.raw_prompt_path,
            prompt_variant=c.prompt_variant,
        )
        self.stats = EngineStats()
        self.calls = 0
        # prompt ids common to every question's prompt (chat template, system prompt): the
        # backend may prefill them once (GenerationRequest.shared_prefix)
        self.shared_prefix = shared_prefix_len(lambda i: encode(self.tokenizer, self.fmt.render_prompt(SENTINELS[i])))

    def make_env(self, question: Question, sample_index: int = 0, seed: int | None = None) -> RetrievalEnv:
        """The environment of one episode, with this engine's format, tokenizer, config and retriever."""
        return RetrievalEnv(question, self.fmt, self.tokenizer, self.config, self.retriever, sample_index, seed)

    # ---- public API -----------------------------------------------------------------------------
    async def astream(
        self, questions: list[Question], n_samples: int | None = None, seed: int | None = None
    ) -> AsyncIterator[Trajectory]:
        """Yield each trajectory as soon as it finishes (order: by finishing round)."""
        n = n_samples or self.config.n_samples
        run_seed = self.config.seed + self.calls if seed is None else seed
        self.calls += 1
        envs = [self.make_env(q, j, run_seed) for q in questions for j in range(n)]
        async for env in drive(envs, self.backend, self.retriever, self.stats, self.on_step, self.shared_prefix):
            yield env.trajectory

    async def arun(
        self,
        questions: list[Question],
        n_samples: int | None = None,
        jsonl_path: str | Path | None = None,
        on_finish: Callable[[Trajectory], None] | None = None,
        seed: int | None = None,
    ) -> list[Trajectory]:
        """Run all trajectories; write each to ``jsonl_path`` and call ``on_finish`` as it ends.
        Returns them in input order (question-major, then sample index)."""
        writer = JsonlWriter(jsonl_path) if jsonl_path is not None else None
        out: list[Trajectory] = []
        try:
            async for traj in self.astream(questions, n_samples, seed=seed):
                out.append(traj)
                if writer is not None:
                    writer.write(traj)
                if on_finish is not None:
                    on_finish(traj)
        finally:
            if writer is not None:
                writer.close()
        order = {(q.id, j): i for i, q in enumerate(questions) for j in range(n_samples or self.config.n_samples)}
        return sorted(out, key=lambda t: order.get((t.question_id, t.sample_index), 0))

    def run(self, questions: list[Question], **kw: Any) -> list[Trajectory]:
        return asyncio.run(self.arun(questions, **kw))

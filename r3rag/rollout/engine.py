"""The batched multi-turn rollout engine.

For a batch of questions x ``n_samples``, one *round* is:

1. build a generation request for every active trajectory (its full token context, its own
   temperature and seed, a turn budget of ``min(max_turn_tokens, tokens left in the trajectory,
   room left in the context)``) and generate them all in one backend call;
2. append each output as a ``model`` segment (ids and log-probs as sampled) and parse it with the
   format: an answer finishes the trajectory (``answered``); a malformed turn finishes it
   (``format_error``, raw text kept), or ``max_tokens`` when the turn was cut by its budget; a
   query at the last allowed step finishes it (``max_steps``);
3. send every query of the round, de-duplicated, in ONE ``retriever.asearch`` call; a failure
   marks all of them ``retrieval_failed``;
4. for each query keep up to ``docs_per_step`` passages not yet shown in this trajectory (by id),
   cut each to ``doc_max_chars`` / ``doc_max_tokens``, and append the format's feedback text as an
   ``env`` segment (tokenised once, mask 0).

Finished trajectories are yielded as soon as their round ends (:meth:`RolloutEngine.astream`),
optionally written to JSONL. Nothing raises for model output or retrieval problems: each ends as
a stop reason from :data:`r3rag.rollout.trajectory.STOP_REASONS`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from r3rag.data.records import Passage, Question
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend, SamplingParams
from r3rag.rollout.backends.shared_prefix import SENTINELS, shared_prefix_len
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.formats.registry import get_format
from r3rag.rollout.io import JsonlWriter
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.tokens import decode, encode, truncate_text_to_tokens
from r3rag.rollout.trajectory import Segment, Step, Trajectory

_SEED_MOD = 2**63 - 1


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


@dataclass
class _State:
    traj: Trajectory
    ids: list[int]
    text: str
    messages: list[dict[str, str]]
    temperature: float
    seed: int
    seen: set[str] = field(default_factory=set)
    n_docs: int = 0
    generated: int = 0
    pending: Step | None = None


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
        # prompt ids common to every question's prompt (chat template, system prompt): the
        # backend may prefill them once (GenerationRequest.shared_prefix)
        self.shared_prefix = shared_prefix_len(lambda i: encode(self.tokenizer, self.fmt.render_prompt(SENTINELS[i])))

    # ---- public API -----------------------------------------------------------------------------
    async def astream(self, questions: list[Question], n_samples: int | None = None) -> AsyncIterator[Trajectory]:
        """Yield each trajectory as soon as it finishes (order: by finishing round)."""
        n = n_samples or self.config.n_samples
        active = [self._start(q, j, qi) for qi, q in enumerate(questions) for j in range(n)]
        while active:
            t0 = time.perf_counter()
            self.stats.rounds += 1
            reqs = [self._request(s) for s in active]
            t1 = time.perf_counter()
            outs = await self._generate(reqs)
            t2 = time.perf_counter()
            self.stats.generate_s += t2 - t1
            to_retrieve: list[_State] = []
            for s, out in zip(active, outs):
                if self._take_turn(s, out):
                    to_retrieve.append(s)
                elif self.on_step is not None and s.traj.steps:
                    self.on_step(s.traj, s.traj.steps[-1])
            t3 = time.perf_counter()
            if to_retrieve:
                await self._retrieve(to_retrieve)
                if self.on_step is not None:
                    for s in to_retrieve:
                        self.on_step(s.traj, s.traj.steps[-1])
            t4 = time.perf_counter()
            self.stats.retrieve_s += t4 - t3
            still: list[_State] = []
            done: list[Trajectory] = []
            for s in active:
                if s.traj.stop_reason is not None:
                    done.append(s.traj)
                else:
                    still.append(s)
            active = still
            self.stats.other_s += (t1 - t0) + (t3 - t2) + (time.perf_counter() - t4)
            for traj in done:
                yield traj

    async def arun(
        self,
        questions: list[Question],
        n_samples: int | None = None,
        jsonl_path: str | Path | None = None,
        on_finish: Callable[[Trajectory], None] | None = None,
    ) -> list[Trajectory]:
        """Run all trajectories; write each to ``jsonl_path`` and call ``on_finish`` as it ends.
        Returns them in input order (question-major, then sample index)."""
        writer = JsonlWriter(jsonl_path) if jsonl_path is not None else None
        out: list[Trajectory] = []
        try:
            async for traj in self.astream(questions, n_samples):
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

    # ---- steps of a round -----------------------------------------------------------------------
    def _start(self, q: Question, sample_index: int, qi: int) -> _State:
        prompt = self.fmt.render_prompt(q.question)
        ids = encode(self.tokenizer, prompt)
        traj = Trajectory(
            question_id=str(q.id),
            question=q.question,
            format_name=self.fmt.name,
            segments=[Segment("prompt", prompt, ids)],
            sample_index=sample_index,
            golden_answers=list(q.golden_answers),
            metadata={"mode": self.fmt.mode},
        )
        seed = (self.config.seed * 1_000_003 + qi * 1009 + sample_index) % _SEED_MOD
        msgs = self.fmt.prompt_messages(q.question) if self.fmt.mode == "chat" else []
        return _State(traj, list(ids), prompt, msgs, self.config.temperature_for(sample_index), seed)

    def _request(self, s: _State) -> GenerationRequest:
        c = self.config
        budget = min(c.max_turn_tokens, c.max_new_tokens - s.generated, c.max_total_tokens - len(s.ids))
        params = SamplingParams(
            max_tokens=max(budget, 0),
            temperature=s.temperature,
            top_p=c.top_p,
            stop=self.fmt.stop,
            seed=(s.seed * 131 + len(s.traj.steps)) % _SEED_MOD,
        )
        return GenerationRequest(list(s.ids), s.text, params, list(s.messages) if s.messages else None,
                                 shared_prefix=self.shared_prefix)

    async def _generate(self, reqs: list[GenerationRequest]) -> list[GenerationOutput]:
        todo = [i for i, r in enumerate(reqs) if r.params.max_tokens > 0]
        outs = [GenerationOutput([], "", None, "length") for _ in reqs]
        if not todo:
            return outs
        try:
            got = await self.backend.agenerate([reqs[i] for i in todo])
            if len(got) != len(todo):
                raise RuntimeError(f"backend returned {len(got)} outputs for {len(todo)} requests")
        except Exception as err:  # noqa: BLE001 - nothing raises out of the engine
            got = [GenerationOutput([], "", None, "error", error=f"{type(err).__name__}: {err}") for _ in todo]
        for i, o in zip(todo, got):
            outs[i] = o
        return outs

    def _take_turn(self, s: _State, out: GenerationOutput) -> bool:
        """Record one model turn; True when its query should be retrieved."""
        c, traj = self.config, s.traj
        index = len(traj.steps)
        if out.token_ids:
            text = decode(self.tokenizer, out.token_ids) if out.exact_ids else out.text
            traj.segments.append(Segment("model", text, list(out.token_ids), out.logprobs))
            s.ids.extend(out.token_ids)
            s.text += text
            s.generated += len(out.token_ids)
            self.stats.generated_tokens += len(out.token_ids)
        else:
            text = ""
        if not out.exact_ids:
            traj.metadata["exact_ids"] = False
        if out.finish_reason == "error":
            traj.steps.append(Step(index, raw=text, format_error=f"backend_error: {out.error}"))
            traj.stop_reason = "format_error"
            return False
        parsed = self.fmt.parse_turn(text, index)
        step = Step(index, analysis=parsed.analysis, query=parsed.query, answer=parsed.answer, raw=text)
        traj.steps.append(step)
        if s.messages:
            eos = self.fmt.eos_text
            s.messages.append({"role": "assistant", "content": text[: -len(eos)] if eos and text.endswith(eos) else text})
        if parsed.error is not None:
            step.format_error = parsed.error
            cut = out.finish_reason == "length" and parsed.error in ("no_marker", "unterminated_tag")
            traj.stop_reason = "max_tokens" if cut else "format_error"
            if cut:
                step.format_error = "truncated"
            return False
        if parsed.answer is not None:
            traj.stop_reason = "answered"
            return False
        if index + 1 >= c.max_steps:
            traj.stop_reason = "max_steps"
            return False
        if s.generated >= c.max_new_tokens or len(s.ids) >= c.max_total_tokens:
            traj.stop_reason = "max_tokens"
            return False
        s.pending = step
        return True

    async def _retrieve(self, states: list[_State]) -> None:
        c = self.config
        unique: dict[str, int] = {}
        for s in states:
            assert s.pending is not None and s.pending.query is not None
            unique.setdefault(s.pending.query, len(unique))
        need = max(len(s.seen) for s in states) if c.dedupe_docs else 0
        k = max(1, min(c.docs_per_step + need, c.max_retrieval_k))
        self.stats.retrieval_calls += 1
        self.stats.queries += len(unique)
        try:
            results = await self.retriever.asearch(list(unique), k)
            if len(results) != len(unique):
                raise RuntimeError(f"retriever returned {len(results)} result lists for {len(unique)} queries")
        except Exception as err:  # noqa: BLE001 - RetrievalError, timeouts, bad replies: all end the same way
            for s in states:
                s.traj.stop_reason = "retrieval_failed"
                s.traj.metadata["retrieval_error"] = f"{type(err).__name__}: {err}"
            return
        for s in states:
            step = s.pending
            assert step is not None and step.query is not None
            s.pending = None
            docs = self._select(s, results[unique[step.query]])
            step.documents = docs
            feedback = self.fmt.feedback_text(s.text, docs, step.index)
            ids = encode(self.tokenizer, feedback)
            s.traj.segments.append(Segment("env", feedback, ids))
            s.ids.extend(ids)
            s.text += feedback
            if s.messages:
                s.messages.append({"role": self.fmt.observation_role, "content": self.fmt.render_documents(docs, step.index)})
            if len(s.ids) >= c.max_total_tokens:
                s.traj.stop_reason = "max_tokens"

    def _select(self, s: _State, found: list[Passage]) -> list[Passage]:
        c = self.config
        room = c.docs_per_step
        if c.max_docs_per_trajectory is not None:
            room = min(room, c.max_docs_per_trajectory - s.n_docs)
        out: list[Passage] = []
        for p in found:
            if len(out) >= room:
                break
            if c.dedupe_docs and p.id in s.seen:
                continue
            s.seen.add(p.id)
            out.append(Passage(p.id, self._truncate(p.contents), p.score))
        s.n_docs += len(out)
        return out

    def _truncate(self, contents: str) -> str:
        c = self.config
        if c.doc_max_chars is not None and len(contents) > c.doc_max_chars:
            contents = contents[: c.doc_max_chars]
        if c.doc_max_tokens is not None:
            contents = truncate_text_to_tokens(self.tokenizer, contents, c.doc_max_tokens)
        return contents

"""The per-trajectory environment: one home for the turn rules.

A :class:`RetrievalEnv` holds one trajectory and applies the rules of a step-by-step retrieval
episode to it. Three drivers use it and none of them repeats a rule:

- the batched :class:`~r3rag.rollout.engine.RolloutEngine` (evaluation, cold start, the RL
  trainer, the demo): it asks every live env for its :meth:`~RetrievalEnv.request`, generates them
  in one backend call, hands each output to :meth:`~RetrievalEnv.record_turn`, sends all queries
  of the round in one retrieval call and gives each env its documents
  (:meth:`~RetrievalEnv.insert_documents`) or the failure (:meth:`~RetrievalEnv.fail_retrieval`);
- the OpenRLHF agent plugin, which owns generation and calls :meth:`~RetrievalEnv.step` once per
  model turn (record, retrieve alone, insert) and appends the feedback ids it returns;
- anything else that wants one episode at a time.

The rules, in the order they apply to a model turn:

1. a backend failure (``finish_reason == "error"``) ends the episode as ``backend_error``
   (the infrastructure's fault: reward recipes drop it); a turn with no tokens records no step
   (every step owns exactly one model segment) and ends it as ``max_tokens`` when its budget was
   0, else ``format_error``;
2. the turn becomes a ``model`` segment (ids and log-probs exactly as sampled) and a
   :class:`~r3rag.rollout.trajectory.Step` parsed by the format; a parse error ends the episode
   (``format_error``, or ``max_tokens`` when the budget cut the turn short), an answer ends it
   (``answered``), a query at the last allowed step ends it (``max_steps``), a full budget ends it
   (``max_tokens``); otherwise the query waits for documents;
3. documents: up to ``docs_per_step`` passages not shown before in this episode (by id, when
   ``dedupe_docs``), at most ``max_docs_per_trajectory`` in all, each cut to ``doc_max_chars`` /
   ``doc_max_tokens``, rendered by the format as an ``env`` segment (tokenised once). The
   feedback must fit in ``max_total_tokens``: documents are cut further to fit, and when not even
   a short version fits the episode stops before them (``max_tokens``), so no trajectory ever
   exceeds its budget;
4. a retrieval failure (after the client's retries) ends the episode as ``retrieval_failed``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

from r3rag.data.records import Passage, Question, gold_passage_ids
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, SamplingParams
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.formats.base import TrajectoryFormat
from r3rag.rollout.retriever import Retriever
from r3rag.rollout.tokens import decode, encode, truncate_text_to_tokens
from r3rag.rollout.trajectory import Segment, Step, Trajectory

_SEED_MOD = 2**63 - 1
#: shortest per-document token cut tried when the feedback must shrink to fit the budget
_MIN_DOC_TOKENS = 8


def trajectory_seed(run_seed: int, question_id: str, sample_index: int) -> int:
    """A trajectory's sampling seed: a function of the run's seed, the question's id and the sample
    index, never of the question's position in a batch (so resumed or reshuffled runs agree).

    >>> trajectory_seed(0, "q1", 0) == trajectory_seed(0, "q1", 0) != trajectory_seed(1, "q1", 0)
    True
    """
    h = zlib.crc32(f"{question_id}\x00{sample_index}".encode())
    return (run_seed * 1_000_003 + h * 7919 + sample_index) % _SEED_MOD


@dataclass
class EnvStep:
    """What :meth:`RetrievalEnv.step` returns: the feedback to append (empty when done)."""

    feedback_text: str
    feedback_ids: list[int]
    done: bool
    step: Step | None


@dataclass
class _Budget:
    generated: int = 0
    n_docs: int = 0
    seen: set[str] = field(default_factory=set)


def gold_metadata(question: Question) -> dict[str, Any]:
    """The question's gold supporting passage ids and hop count, when it has them.

    The ids (:func:`~r3rag.data.records.gold_passage_ids`) go on the trajectory so that a process
    reward scoring the trajectory alone finds them.

    >>> gold_metadata(Question("q", "?", ["a"], {"hops": 2, "decomposition": [{"supporting_ids": ["p1"]}, {"supporting_ids": ["p2", "p1"]}]}))
    {'supporting_ids': ['p1', 'p2'], 'hops': 2}
    """
    meta = question.metadata or {}
    ids = gold_passage_ids(meta)
    out: dict[str, Any] = {"supporting_ids": ids} if ids else {}
    if meta.get("hops") is not None:
        out["hops"] = meta["hops"]
    return out


class RetrievalEnv:
    """One episode: a question, a format, a token budget and (optionally) a retriever."""

    def __init__(
        self,
        question: Question,
        fmt: TrajectoryFormat,
        tokenizer: Any,
        config: RolloutConfig,
        retriever: Retriever | None = None,
        sample_index: int = 0,
        seed: int | None = None,
    ) -> None:
        self.fmt = fmt
        self.tokenizer = tokenizer
        self.config = config
        self.retriever = retriever
        prompt = fmt.render_prompt(question.question)
        ids = encode(tokenizer, prompt)
        self.trajectory = Trajectory(
            question_id=str(question.id),
            question=question.question,
            format_name=fmt.name,
            segments=[Segment("prompt", prompt, ids)],
            sample_index=sample_index,
            golden_answers=list(question.golden_answers),
            metadata={"mode": fmt.mode, **gold_metadata(question)},
        )
        self.ids: list[int] = list(ids)
        self.text = prompt
        #: the conversation as chat messages (chat mode), for backends that take messages
        self.messages: list[dict[str, str]] = fmt.prompt_messages(question.question) if fmt.mode == "chat" else []
        self.temperature = config.temperature_for(sample_index)
        self.seed = trajectory_seed(config.seed if seed is None else seed, str(question.id), sample_index)
        self.pending: Step | None = None
        self._b = _Budget()

    # ---- views ------------------------------------------------------------------------------
    @property
    def prompt_text(self) -> str:
        return self.trajectory.segments[0].text

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.trajectory.segments[0].token_ids)

    @property
    def done(self) -> bool:
        return self.trajectory.stop_reason is not None

    def _stop(self, reason: str) -> None:
        self.trajectory.stop_reason = reason  # type: ignore[assignment]

    # ---- a model turn -----------------------------------------------------------------------
    def turn_budget(self) -> int:
        """Tokens the next model turn may generate (0: none left)."""
        c = self.config
        return max(0, min(c.max_turn_tokens, c.max_new_tokens - self._b.generated, c.max_total_tokens - len(self.ids)))

    def request(self, shared_prefix: int = 0) -> GenerationRequest:
        """The generation request for the next model turn (its own temperature, seed and budget)."""
        params = SamplingParams(
            max_tokens=self.turn_budget(),
            temperature=self.temperature,
            top_p=self.config.top_p,
            stop=self.fmt.stop,
            seed=(self.seed * 131 + len(self.trajectory.steps)) % _SEED_MOD,
        )
        return GenerationRequest(list(self.ids), self.text, params, list(self.messages) if self.messages else None,
                                 shared_prefix=shared_prefix)

    def record_turn(self, out: GenerationOutput) -> Step | None:
        """Record one model turn (rules 1-2). Returns the query step that now needs documents,
        or ``None`` when the turn ended the episode or needs none."""
        if self.done:
            raise RuntimeError("record_turn on a finished episode")
        traj, c = self.trajectory, self.config
        if not out.exact_ids:
            traj.metadata["exact_ids"] = False
        if out.finish_reason == "error":
            traj.metadata["backend_error"] = out.error or "unknown backend error"
            self._stop("backend_error")
            return None
        if not out.token_ids:
            self._stop("max_tokens" if out.finish_reason == "length" else "format_error")
            traj.metadata.setdefault("empty_turn", True)
            return None
        text = decode(self.tokenizer, out.token_ids) if out.exact_ids else out.text
        index = len(traj.steps)
        traj.segments.append(Segment("model", text, list(out.token_ids), out.logprobs))
        self.ids.extend(out.token_ids)
        self.text += text
        self._b.generated += len(out.token_ids)
        parsed = self.fmt.parse_turn(text, index)
        step = Step(index, analysis=parsed.analysis, query=parsed.query, answer=parsed.answer, raw=text,
                    segment=len(traj.segments) - 1)
        traj.steps.append(step)
        if self.messages:
            eos = self.fmt.eos_text
            self.messages.append({"role": "assistant", "content": text[: -len(eos)] if eos and text.endswith(eos) else text})
        if parsed.error is not None:
            cut = out.finish_reason == "length" and parsed.error in ("no_marker", "unterminated_tag")
            step.format_error = "truncated" if cut else parsed.error
            self._stop("max_tokens" if cut else "format_error")
            return None
        if parsed.answer is not None:
            self._stop("answered")
            return None
        if index + 1 >= c.max_steps:
            self._stop("max_steps")
            return None
        if self._b.generated >= c.max_new_tokens or len(self.ids) >= c.max_total_tokens:
            self._stop("max_tokens")
            return None
        self.pending = step
        return step

    # ---- documents --------------------------------------------------------------------------
    def retrieval_k(self) -> int:
        """How many passages to ask for, so that ``docs_per_step`` new ones survive de-duplication."""
        c = self.config
        need = len(self._b.seen) if c.dedupe_docs else 0
        return max(1, min(c.docs_per_step + need, c.max_retrieval_k))

    def insert_documents(self, found: list[Passage]) -> Segment | None:
        """Insert the retriever's answer for the pending query (rule 3). Returns the ``env`` segment
        appended, or ``None`` when not even a shortened feedback fits the token budget (the episode
        then stops as ``max_tokens``)."""
        step = self._take_pending()
        step.retrieved = True
        docs = self._select(found)
        room = self.config.max_total_tokens - len(self.ids)
        feedback, ids, docs = self._fit(docs, step.index, room)
        if feedback is None:
            step.documents = []
            self.trajectory.metadata["documents_cut"] = "no room for documents"
            self._stop("max_tokens")
            return None
        step.documents = docs
        seg = Segment("env", feedback, ids)
        self.trajectory.segments.append(seg)
        self.ids.extend(ids)
        self.text += feedback
        if self.messages:
            self.messages.append({"role": self.fmt.observation_role, "content": self.fmt.render_documents(docs, step.index)})
        if len(self.ids) >= self.config.max_total_tokens:
            self._stop("max_tokens")
        return seg

    def fail_retrieval(self, error: str) -> None:
        """The retriever failed for the pending query (rule 4)."""
        self._take_pending()
        self.trajectory.metadata["retrieval_error"] = error
        self._stop("retrieval_failed")

    async def step(self, out: GenerationOutput) -> EnvStep:
        """One whole environment step for a driver that generates on its own (the OpenRLHF plugin):
        record the turn, retrieve for its query alone, insert the documents."""
        step = self.record_turn(out)
        last = self.trajectory.steps[-1] if self.trajectory.steps else None
        if step is None:
            return EnvStep("", [], True, last)
        if self.retriever is None:
            raise RuntimeError("RetrievalEnv.step needs a retriever")
        try:
            found = await self.retriever.asearch([step.query or ""], self.retrieval_k())
            if len(found) != 1:
                raise RuntimeError(f"retriever returned {len(found)} result lists for 1 query")
        except Exception as err:  # noqa: BLE001 - every retrieval failure ends the episode the same way
            self.fail_retrieval(f"{type(err).__name__}: {err}")
            return EnvStep("", [], True, step)
        seg = self.insert_documents(found[0])
        if seg is None:
            return EnvStep("", [], True, step)
        return EnvStep(seg.text, list(seg.token_ids), self.done, step)

    # ---- helpers ----------------------------------------------------------------------------
    def _take_pending(self) -> Step:
        if self.pending is None:
            raise RuntimeError("no query is waiting for documents")
        step, self.pending = self.pending, None
        return step

    def _select(self, found: list[Passage]) -> list[Passage]:
        c, b = self.config, self._b
        room = c.docs_per_step
        if c.max_docs_per_trajectory is not None:
            room = min(room, c.max_docs_per_trajectory - b.n_docs)
        out: list[Passage] = []
        for p in found:
            if len(out) >= room:
                break
            if c.dedupe_docs and p.id in b.seen:
                continue
            b.seen.add(p.id)
            out.append(Passage(p.id, self._truncate(p.contents), p.score))
        b.n_docs += len(out)
        return out

    def _truncate(self, contents: str, max_tokens: int | None = None) -> str:
        c = self.config
        if c.doc_max_chars is not None and len(contents) > c.doc_max_chars:
            contents = contents[: c.doc_max_chars]
        cap = c.doc_max_tokens if max_tokens is None else (min(max_tokens, c.doc_max_tokens) if c.doc_max_tokens else max_tokens)
        if cap is not None:
            contents = truncate_text_to_tokens(self.tokenizer, contents, cap)
        return contents

    def _render(self, docs: list[Passage], index: int) -> tuple[str, list[int]]:
        feedback = self.fmt.feedback_text(self.text, docs, index)
        return feedback, encode(self.tokenizer, feedback)

    def _fit(self, docs: list[Passage], index: int, room: int) -> tuple[str | None, list[int], list[Passage]]:
        """The feedback for ``docs`` if it fits in ``room`` tokens; else the documents cut to the
        longest per-document token length that fits (binary search), else ``(None, [], [])``."""
        feedback, ids = self._render(docs, index)
        if len(ids) <= room:
            return feedback, ids, docs
        longest = max((len(encode(self.tokenizer, d.contents)) for d in docs), default=0)
        best: tuple[str, list[int], list[Passage]] | None = None
        lo, hi = _MIN_DOC_TOKENS, longest - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            cut = [Passage(d.id, truncate_text_to_tokens(self.tokenizer, d.contents, mid), d.score) for d in docs]
            fb, fb_ids = self._render(cut, index)
            if len(fb_ids) <= room:
                best, lo = (fb, fb_ids, cut), mid + 1
            else:
                hi = mid - 1
        if best is None:
            return None, [], []
        self.trajectory.metadata["documents_cut"] = "documents shortened to fit max_total_tokens"
        return best

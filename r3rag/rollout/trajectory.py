"""A trajectory: what a policy wrote and what the environment inserted, token by token.

A trajectory is a list of *segments*, each owned by one party:

- ``prompt``: the rendered prompt (system + question), never trained on;
- ``model``: tokens the policy sampled, stored exactly as sampled (ids and log-probs);
- ``env``: text the environment inserted (retrieved documents, the next-step cue), never
  trained on.

The token ids of the whole trajectory are the concatenation of the segments' ids, so the loss
mask (1 on ``model`` tokens, 0 elsewhere) comes from one place and nothing is re-tokenised.

On top of the segments a trajectory keeps its *steps* (analysis, query or answer, the documents
that query brought back) and why it stopped. Rewards, SFT export, RL, evaluation and the demo
all read this one structure.

What a trainer reads, from the trajectory alone:

- :attr:`Trajectory.token_ids` and :attr:`Trajectory.loss_mask`: the exact context and which
  tokens the policy sampled. The mask refuses (:class:`~r3rag.errors.NotTrainableError`) when the
  ids are not known to be the model's own (:attr:`Trajectory.exact_ids` is False: a chat endpoint
  that re-renders the conversation, or a text-only server whose text was re-tokenised here);
- :attr:`Trajectory.step_spans`: which model segment each step owns, as a token range; a step's
  reward goes on its last token (``span.end - 1``). Every step has exactly one model segment;
- :attr:`Trajectory.trainable`: False for inexact ids and for infrastructure failures
  (:data:`INFRA_FAILURES`: the backend or the retriever failed, not the policy), which reward
  recipes drop instead of penalising.

>>> t = Trajectory("q", "?", "r3rag_steps", segments=[Segment("prompt", "P", [1, 2]),
...     Segment("model", "Q", [3, 4]), Segment("env", "D", [5]), Segment("model", "A", [6])],
...     steps=[Step(0, query="x", segment=1), Step(1, answer="y", segment=3)], stop_reason="answered")
>>> t.loss_mask, [(s.step, s.start, s.end) for s in t.step_spans], t.trainable
([0, 0, 1, 1, 0, 1], [(0, 2, 4), (1, 5, 6)], True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from r3rag.data.records import Passage
from r3rag.errors import NotTrainableError

Role = Literal["prompt", "model", "env"]
StopReason = Literal["answered", "max_steps", "max_tokens", "format_error", "retrieval_failed", "backend_error"]
STOP_REASONS: tuple[str, ...] = (
    "answered", "max_steps", "max_tokens", "format_error", "retrieval_failed", "backend_error",
)
#: stop reasons that are the infrastructure's fault, never the policy's: not scored, not trained on
INFRA_FAILURES: frozenset[str] = frozenset({"retrieval_failed", "backend_error"})


@dataclass
class Segment:
    role: Role
    text: str
    token_ids: list[int]
    logprobs: list[float] | None = None  # one per token, for ``model`` segments when known

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "text": self.text, "token_ids": self.token_ids, "logprobs": self.logprobs}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Segment":
        return cls(role=d["role"], text=d["text"], token_ids=list(d["token_ids"]), logprobs=d.get("logprobs"))


@dataclass
class Step:
    """One reasoning step: the model's analysis, then either a query (with its documents) or an answer.

    ``format_error`` names what was wrong with the model's turn (``None`` when it parsed).
    ``raw`` is the model text of this step exactly as generated. ``segment`` is the index, in the
    trajectory's segments, of the model segment holding that text. ``retrieved`` is True once the
    retriever answered this step's query (its documents, possibly none new, were inserted).
    """

    index: int
    analysis: str = ""
    query: str | None = None
    answer: str | None = None
    documents: list[Passage] = field(default_factory=list)
    format_error: str | None = None
    raw: str = ""
    segment: int | None = None
    retrieved: bool = False

    @property
    def is_query(self) -> bool:
        return self.query is not None

    @property
    def is_answer(self) -> bool:
        return self.answer is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "analysis": self.analysis,
            "query": self.query,
            "answer": self.answer,
            "documents": [p.to_dict() for p in self.documents],
            "format_error": self.format_error,
            "raw": self.raw,
            "segment": self.segment,
            "retrieved": self.retrieved,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Step":
        return cls(
            index=d["index"],
            analysis=d.get("analysis", ""),
            query=d.get("query"),
            answer=d.get("answer"),
            documents=[Passage.from_dict(p) for p in d.get("documents", [])],
            format_error=d.get("format_error"),
            raw=d.get("raw", ""),
            segment=d.get("segment"),
            retrieved=bool(d.get("retrieved", False)),
        )


@dataclass(frozen=True)
class StepSpan:
    """Step ``step`` owns ``token_ids[start:end]`` (its model segment); its last token is ``end - 1``."""

    step: int
    start: int
    end: int

    @property
    def last(self) -> int:
        return self.end - 1


@dataclass
class Trajectory:
    question_id: str
    question: str
    format_name: str
    segments: list[Segment] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    stop_reason: StopReason | None = None
    sample_index: int = 0
    golden_answers: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    # ---- derived views -------------------------------------------------------------------
    @property
    def answer(self) -> str | None:
        """The final answer (the last answering step's), or ``None`` if it never answered."""
        for step in reversed(self.steps):
            if step.answer is not None:
                return step.answer
        return None

    @property
    def queries(self) -> list[str]:
        return [s.query for s in self.steps if s.query is not None]

    @property
    def num_retrievals(self) -> int:
        """Queries the retriever answered (a parsed query that was never executed does not count)."""
        return sum(1 for s in self.steps if s.query is not None and s.retrieved)

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def exact_ids(self) -> bool:
        """True when every model segment holds the ids the policy sampled in exactly this context."""
        return bool(self.metadata.get("exact_ids", True))

    @property
    def infra_failed(self) -> bool:
        """The trajectory ended because the backend or the retriever failed (not the policy)."""
        return self.stop_reason in INFRA_FAILURES

    @property
    def trainable(self) -> bool:
        """May a trainer learn from it? Needs exact ids and no infrastructure failure."""
        return self.exact_ids and not self.infra_failed

    @property
    def loss_mask(self) -> list[int]:
        """1 for every token the policy sampled, 0 for prompt and environment tokens.

        Raises :class:`~r3rag.errors.NotTrainableError` when the ids are not exact: a mask over
        ids the model never saw would train it on a context it did not produce."""
        if not self.exact_ids:
            raise NotTrainableError(
                f"trajectory {self.question_id}#{self.sample_index}: token ids are not exact "
                "(an OpenAI-compatible chat or text-only server produced them); use it for SFT text, not as token-level training data"
            )
        return [1 if s.role == "model" else 0 for s in self.segments for _ in s.token_ids]

    @property
    def step_spans(self) -> list[StepSpan]:
        """One :class:`StepSpan` per step, in step order (token offsets into :attr:`token_ids`)."""
        starts: list[int] = []
        pos = 0
        for seg in self.segments:
            starts.append(pos)
            pos += len(seg.token_ids)
        spans: list[StepSpan] = []
        for st in self.steps:
            if st.segment is None or not 0 <= st.segment < len(self.segments):
                raise ValueError(f"trajectory {self.question_id}: step {st.index} has no model segment")
            seg = self.segments[st.segment]
            if seg.role != "model" or not seg.token_ids:
                raise ValueError(f"trajectory {self.question_id}: step {st.index} points at a {seg.role} segment")
            spans.append(StepSpan(st.index, starts[st.segment], starts[st.segment] + len(seg.token_ids)))
        return spans

    @property
    def text(self) -> str:
        return "".join(s.text for s in self.segments)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.role == "model")

    @property
    def response_token_ids(self) -> list[int]:
        """Everything after the prompt (model and environment tokens)."""
        return [t for s in self.segments if s.role != "prompt" for t in s.token_ids]

    @property
    def counts(self) -> dict[str, int]:
        """Sizes at a glance: steps, retrievals, documents shown, and tokens by role."""
        by_role = {r: sum(len(s.token_ids) for s in self.segments if s.role == r) for r in ("prompt", "model", "env")}
        return {
            "steps": len(self.steps),
            "retrievals": self.num_retrievals,
            "documents": sum(len(s.documents) for s in self.steps),
            "prompt_tokens": by_role["prompt"],
            "generated_tokens": by_role["model"],
            "env_tokens": by_role["env"],
        }

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "question": self.question,
            "format_name": self.format_name,
            "sample_index": self.sample_index,
            "golden_answers": self.golden_answers,
            "stop_reason": self.stop_reason,
            "trainable": self.trainable,
            "answer": self.answer,
            "counts": self.counts,
            "steps": [s.to_dict() for s in self.steps],
            "segments": [s.to_dict() for s in self.segments],
            "metadata": self.metadata,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Trajectory":
        return cls(
            question_id=str(d["question_id"]),
            question=d["question"],
            format_name=d["format_name"],
            segments=[Segment.from_dict(s) for s in d.get("segments", [])],
            steps=[Step.from_dict(s) for s in d.get("steps", [])],
            stop_reason=d.get("stop_reason"),
            sample_index=d.get("sample_index", 0),
            golden_answers=list(d.get("golden_answers", [])),
            metadata=dict(d.get("metadata", {})),
        )

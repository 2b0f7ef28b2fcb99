"""The HF backend on a CUDA GPU (marked ``gpu``: skipped on machines without one, see conftest.py).

A tiny random model on the GPU must produce the tokens it produces on the CPU (greedy, float32),
through batching, the prefix cache and the shared-prompt prefix; bfloat16 must run and return
log-probs for every token. The CPU suite cannot see device bugs (a tensor left on the CPU, a cache
built on the wrong device), which is what this file is for.
"""

from __future__ import annotations

import math

import pytest
import torch
from rollout_helpers import mixed_requests, tiny_model, tiny_tokenizer

from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.hf import HFBackend
from r3rag.rollout.tokens import encode

pytestmark = pytest.mark.gpu
PROMPTS = ["The question: who", "Step 1:\nThe problem analysis: we need the birthplace of Varnel", "<think>"]


def requests(tok, continue_from=None):
    """Greedy requests; with ``continue_from`` (earlier outputs) each prompt is extended by its own
    output plus more text, so the backend's prefix cache serves the earlier turn's keys/values."""
    texts = PROMPTS if continue_from is None else [p + o.text + "\nStep 2:" for p, o in zip(PROMPTS, continue_from)]
    return [GenerationRequest(encode(tok, t), t, SamplingParams(max_tokens=16)) for t in texts]


def test_cuda_greedy_equals_cpu_greedy():
    tok = tiny_tokenizer()
    cpu = HFBackend(tiny_model(), tok, max_batch_size=8).generate_batch(requests(tok))
    gpu_model = tiny_model().to("cuda")
    gpu = HFBackend(gpu_model, tok, max_batch_size=8)
    first = gpu.generate_batch(requests(tok))
    assert [o.token_ids for o in first] == [o.token_ids for o in cpu]
    cpu2 = HFBackend(tiny_model(), tok, max_batch_size=8, prefix_cache=False).generate_batch(requests(tok, cpu))
    second = gpu.generate_batch(requests(tok, first))  # a second turn: served from the GPU prefix cache
    assert [o.token_ids for o in second] == [o.token_ids for o in cpu2]
    assert all(o.finish_reason != "error" for o in first + second), [o.error for o in first + second]


def test_cuda_bfloat16_generates_with_logprobs():
    tok = tiny_tokenizer()
    model = tiny_model().to(device="cuda", dtype=torch.bfloat16)
    outs = HFBackend(model, tok, max_batch_size=8).generate_batch(
        [GenerationRequest(encode(tok, p), p, SamplingParams(max_tokens=12, temperature=0.7, seed=3)) for p in PROMPTS])
    assert all(o.finish_reason != "error" for o in outs), [o.error for o in outs]
    for o in outs:
        assert o.token_ids and len(o.logprobs) == len(o.token_ids)
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in o.logprobs)


def test_cuda_mixed_batch_equals_each_request_alone():
    """The batched token choice on the GPU (one softmax, top-p and draw for all sampling rows):
    greedy, sampled, top-p and teacher-forced rows in one batch give what each gives alone."""
    gpu = HFBackend(tiny_model().to("cuda"), tiny_tokenizer(), max_batch_size=8)
    reqs, free = mixed_requests(gpu, PROMPTS)
    batch = gpu.generate_batch(reqs)
    alone = [gpu.generate_batch([r])[0] for r in reqs]
    assert all(o.finish_reason != "error" for o in batch), [o.error for o in batch]
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
    assert batch[3].token_ids == free.token_ids
    for b, a in zip(batch, alone):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)

"""HF backend prefill in length groups and the reserved (in-place) KV cache give unchanged results."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import tiny_model, tiny_tokenizer

import r3rag.rollout.backends.hf as hf_mod
from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.hf import HFBackend
from r3rag.rollout.tokens import encode

torch.set_num_threads(1)
SHORT = "The question: who"
LONG = "Step 1:\nThe problem analysis: we need the birthplace of Varnel Oskaro, born in Quessa in 1874. " * 6


def _req(text: str, max_tokens: int = 10, temperature: float = 0.0, seed: int | None = None) -> GenerationRequest:
    ids = encode(tiny_tokenizer(), text)
    return GenerationRequest(ids, text, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))


def test_length_groups_split_only_when_padding_is_costly():
    # rows of 10, 10 and 200 new tokens (no cache, width 0): cost n*n each; the two short rows pad
    # nothing (2*10*10 = 200 = real), adding the long one would cost 3*200*200 = 120000 > 1.25*40200
    assert hf_mod._length_groups([0, 0, 0], [10, 200, 10], width=0) == [[0, 2], [1]]
    # equal rows always share one group
    assert hf_mod._length_groups([50, 50, 50], [7, 7, 7]) == [[0, 1, 2]]
    # cached prefixes count: same new part, contexts of 0 vs 900 -> separate groups
    assert hf_mod._length_groups([0, 900], [40, 40], width=0) == [[0], [1]]


def test_reserved_layer_matches_concatenation_and_grows():
    from transformers import DynamicCache

    model = tiny_model()
    cache = DynamicCache(config=model.config)
    ref = DynamicCache(config=model.config)
    k0, v0 = torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16)
    cache.update(k0, v0, 0)
    ref.update(k0, v0, 0)
    hf_mod._preallocate(cache, 2)  # room for 2 more: the 3rd..5th updates must grow the buffer
    for step in range(5):
        k, v = torch.full((2, 2, 1, 16), float(step)), torch.full((2, 2, 1, 16), -float(step))
        got = cache.update(k, v, 0)
        want = ref.update(k, v, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert cache.get_seq_length() == 8
    keep = torch.tensor([1])
    cache.batch_select_indices(keep)
    ref.batch_select_indices(keep)
    assert torch.equal(cache.layers[0].keys, ref.layers[0].keys)
    got = cache.update(torch.ones(1, 2, 1, 16), torch.ones(1, 2, 1, 16), 0)
    assert got[0].shape == (1, 2, 9, 16) and torch.equal(got[0][0, :, :8], ref.layers[0].keys[0])


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_grouped_prefill_equals_one_padded_batch_and_one_at_a_time(monkeypatch, prefix_cache):
    """A second turn mixing a short and a long cached context (several prefill groups) gives the
    same tokens and log-probs as one padded batch and as each request alone."""
    tok = tiny_tokenizer()

    def run(groups_fn, alone: bool) -> list:
        monkeypatch.setattr(hf_mod, "_length_groups", groups_fn)
        be = HFBackend(tiny_model(), tok, prefix_cache=prefix_cache)
        first = [_req(SHORT), _req(LONG), _req(SHORT + " was", temperature=0.8, seed=3)]
        gen = (lambda rs: [be.generate_batch([r])[0] for r in rs]) if alone else be.generate_batch
        outs = gen(first)
        second = []
        for r, o in zip(first, outs):
            more = encode(tok, " The retrieval documents: (1) Quessa.")
            second.append(GenerationRequest(r.prompt_ids + o.token_ids + more, "", r.params))
        return outs + gen(second)

    real = hf_mod._length_groups
    grouped = run(real, alone=False)
    one_batch = run(lambda n_old, n_new, **kw: [list(range(len(n_new)))], alone=False)
    alone = run(real, alone=True)
    assert 200 < hf_mod._dense_cost_in_positions(tiny_model()) < 400  # ~74k dense params / 256
    assert len(real([0, 0, 0], [len(_req(SHORT).prompt_ids), len(_req(LONG).prompt_ids), 5])) > 1
    for a, b, c in zip(grouped, one_batch, alone):
        assert a.token_ids == b.token_ids == c.token_ids and len(a.token_ids) == 10
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert a.logprobs == pytest.approx(c.logprobs, abs=1e-4)

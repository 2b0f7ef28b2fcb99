"""The transformers backend: batching with left padding, stop strings, budgets, seeds, log-probs."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import mixed_requests, tiny_model, tiny_tokenizer

from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.hf import HFBackend, ModelLoadError, load_model
from r3rag.rollout.backends.registry import get_backend
from r3rag.rollout.tokens import encode
from r3rag.testing.tiny_models import save_tiny_model

torch.set_num_threads(1)
PROMPTS = ["The question: who", "Step 1:\nThe problem analysis: we need the birthplace of Varnel", "<think>"]


def req(text, **kw):
    tok = tiny_tokenizer()
    return GenerationRequest(encode(tok, text), text, SamplingParams(**kw))


@pytest.fixture(scope="module")
def backend():
    return HFBackend(tiny_model(), tiny_tokenizer(), max_batch_size=8)


def test_batched_greedy_equals_one_at_a_time(backend):
    batch = backend.generate_batch([req(p, max_tokens=12) for p in PROMPTS])
    alone = [backend.generate_batch([req(p, max_tokens=12)])[0] for p in PROMPTS]
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
    assert all(len(o.token_ids) == 12 and o.finish_reason == "length" for o in batch)


@pytest.mark.parametrize("temperature,top_p", [(0.0, 1.0), (1.0, 1.0), (0.7, 1.0), (0.7, 0.8)])
def test_logprobs_are_of_the_distribution_sampled_from(backend, temperature, top_p):
    """Log-probs under softmax(logits / T), renormalised over the top-p nucleus; greedy: raw."""
    out = backend.generate_batch([req(PROMPTS[1], max_tokens=8, temperature=temperature, top_p=top_p, seed=5)])[0]
    prompt = encode(tiny_tokenizer(), PROMPTS[1])
    ids = torch.tensor([prompt + out.token_ids])
    with torch.no_grad():
        logits = backend.model(input_ids=ids).logits[0].float()  # (T, V)
    expected = []
    for i, t in enumerate(out.token_ids):
        row = logits[len(prompt) - 1 + i]
        if temperature <= 0:
            expected.append(float(torch.log_softmax(row, -1)[t]))
            continue
        p = torch.softmax(row / temperature, -1)
        sp, order = torch.sort(p, descending=True)
        keep = order[(torch.cumsum(sp, -1) - sp) < top_p]  # the nucleus
        assert t in keep.tolist()  # never sampled outside it
        expected.append(float(torch.log(p[t] / p[keep].sum())))
    assert out.logprobs == pytest.approx(expected, abs=1e-4)
    if temperature == 0.7:  # the scaled distribution differs from the raw one: a real check
        raw = [float(torch.log_softmax(logits[len(prompt) - 1 + i], -1)[t]) for i, t in enumerate(out.token_ids)]
        assert out.logprobs != pytest.approx(raw, abs=1e-3)


def test_update_weights_loads_them_and_drops_every_cache():
    import copy

    from r3rag.rollout.backends.shared_prefix import SENTINELS  # noqa: F401 - the shared-prefix store is exercised below

    tok = tiny_tokenizer()
    model = copy.deepcopy(tiny_model())
    b = HFBackend(model, tok, shared_prefix_tokens=2)
    text = PROMPTS[1]
    first = b.generate_batch([GenerationRequest(encode(tok, text), text, SamplingParams(max_tokens=6), shared_prefix=4)])[0]
    assert b._kv and len(b.shared) > 0  # a turn prefix and a shared prompt prefix are cached
    new = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    b.update_weights(new)
    assert not b._kv and len(b.shared) == 0 and b.weight_version == 1
    assert torch.equal(model.state_dict()["lm_head.weight"], new["lm_head.weight"])
    again = b.generate_batch([GenerationRequest(encode(tok, text), text, SamplingParams(max_tokens=6), shared_prefix=4)])[0]
    assert again.logprobs != pytest.approx(first.logprobs, abs=1e-4)  # computed with the new weights
    # in place (a trainer sharing the model object): None just drops the caches
    b.update_weights(None)
    assert not b._kv and b.weight_version == 2


def test_remote_backend_refuses_weight_updates():
    from r3rag.rollout.backends.base import WeightUpdateError
    from r3rag.rollout.backends.openai_compat import OpenAICompatBackend

    b = OpenAICompatBackend("http://127.0.0.1:9", "m", tiny_tokenizer())
    with pytest.raises(WeightUpdateError, match="cannot update"):
        b.update_weights({})


def test_stop_string_kept_and_output_is_a_prefix(backend):
    free = backend.generate_batch([req(PROMPTS[0], max_tokens=20)])[0]
    stop = free.text[6:9]
    assert len(stop) == 3
    out = backend.generate_batch([req(PROMPTS[0], max_tokens=20, stop=[stop])])[0]
    assert out.finish_reason == "stop" and out.stop_string == stop
    assert stop in out.text and free.token_ids[: len(out.token_ids)] == out.token_ids
    assert len(out.token_ids) < 20
    # the stop string occurs in the text first within the last sampled token
    assert stop not in backend.tokenizer.decode(out.token_ids[:-1])


def test_seeds_and_per_row_temperatures(backend):
    a = backend.generate_batch([req(PROMPTS[0], max_tokens=10, temperature=1.0, seed=1)])[0]
    b = backend.generate_batch([req(PROMPTS[0], max_tokens=10, temperature=1.0, seed=1)])[0]
    c = backend.generate_batch([req(PROMPTS[0], max_tokens=10, temperature=1.0, seed=2)])[0]
    assert a.token_ids == b.token_ids != c.token_ids
    greedy = backend.generate_batch([req(PROMPTS[0], max_tokens=10)])[0]
    mixed = backend.generate_batch(
        [req(PROMPTS[0], max_tokens=10, temperature=1.0, seed=1), req(PROMPTS[0], max_tokens=10, temperature=0.0)]
    )
    assert mixed[0].token_ids == a.token_ids and mixed[1].token_ids == greedy.token_ids


def test_per_row_budgets_and_eos(backend):
    outs = backend.generate_batch([req(PROMPTS[0], max_tokens=3), req(PROMPTS[2], max_tokens=7)])
    assert [len(o.token_ids) for o in outs] == [3, 7]
    eos_backend = HFBackend(tiny_model(), tiny_tokenizer())
    first = backend.generate_batch([req(PROMPTS[0], max_tokens=5)])[0].token_ids[0]
    eos_backend.eos_ids = {first}
    out = eos_backend.generate_batch([req(PROMPTS[0], max_tokens=5)])[0]
    assert (out.token_ids, out.finish_reason) == ([first], "eos")


def test_load_model_from_folder_and_bad_path(tmp_path):
    path = save_tiny_model(tmp_path / "tiny")
    be = get_backend("hf", model=str(path))
    out = be.generate(["The question: who"], max_tokens=4, n=2, temperature=1.0, seed=0)
    assert len(out) == 1 and len(out[0]) == 2 and all(len(o.token_ids) == 4 for o in out[0])
    with pytest.raises(ModelLoadError, match="cannot load model"):
        load_model(tmp_path / "missing")
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        load_model(tmp_path / "x.gguf")


def test_forced_ids_are_emitted_and_scored(backend):
    free = backend.generate_batch([req(PROMPTS[0], max_tokens=6, temperature=1.0, seed=9)])[0]
    r = req(PROMPTS[0], max_tokens=20)
    r.forced_ids = free.token_ids
    forced = backend.generate_batch([r, req(PROMPTS[1], max_tokens=4)])
    assert forced[0].token_ids == free.token_ids and forced[0].finish_reason == "stop"
    assert forced[0].logprobs == pytest.approx(free.logprobs, abs=1e-5)
    assert len(forced[1].token_ids) == 4


@pytest.mark.parametrize("autocast,tol", [(None, 1e-4), (torch.bfloat16, 0.05)])  # bf16: rounding of the same computation
def test_prefix_cache_reuses_turns_without_changing_results(autocast, tol):
    """Multi-turn forced rollouts (oracle text) score the same log-probs with and without the KV
    prefix cache (float32, and bf16 autocast as the RL rollout runs), and the cache is actually
    hit on later turns."""
    from rollout_helpers import CORPUS, QUESTIONS

    from r3rag.rollout.backends.forced import ForcedBackend
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats import get_format
    from r3rag.rollout.oracle import OracleBackend
    from r3rag.testing.fake_retriever import OverlapRetriever

    tok = tiny_tokenizer()
    f = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    runs = {}
    for on in (True, False):
        hf = HFBackend(tiny_model(), tok, prefix_cache=on, autocast_dtype=autocast)
        be = ForcedBackend(hf, OracleBackend(QUESTIONS, f, tok))
        trajs = RolloutEngine(be, OverlapRetriever(CORPUS), RolloutConfig(docs_per_step=2), fmt=f).run(QUESTIONS)
        runs[on] = (trajs, hf.cache_hits)
    (with_cache, hits), (without, no_hits) = runs[True], runs[False]
    assert hits == 4 and no_hits == 0  # q1: turns 2 and 3; q2, q3: turn 2
    for a, b in zip(with_cache, without):
        assert a.token_ids == b.token_ids
        la = [x for s in a.segments if s.role == "model" for x in s.logprobs]
        lb = [x for s in b.segments if s.role == "model" for x in s.logprobs]
        assert la == pytest.approx(lb, abs=tol)


def test_prefix_cache_memory_is_bounded():
    hf = HFBackend(tiny_model(), tiny_tokenizer(), max_cached_bytes=50_000)
    for i in range(6):
        hf.generate_batch([req(PROMPTS[1] + " x" * i, max_tokens=4)])
    assert 0 < hf._kv_bytes <= 50_000 and len(hf._kv) < 6


def test_autocast_generation_uses_bf16_and_stays_consistent():
    """``autocast_dtype=bfloat16`` (the RL trainer's rollout on an AVX-512 CPU, weights kept in
    float32): the model's matmuls really run in bf16 (a forward hook sees bf16 activations), the
    weights stay float32, and batched greedy equals one at a time. Prefix-cache reuse under
    autocast: test_prefix_cache_reuses_turns_without_changing_results."""
    tok = tiny_tokenizer()
    model = tiny_model()
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    handle = linear.register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    be = HFBackend(model, tok, max_batch_size=8, autocast_dtype=torch.bfloat16)
    batch = be.generate_batch([req(p, max_tokens=10) for p in PROMPTS])
    alone = [be.generate_batch([req(p, max_tokens=10)])[0] for p in PROMPTS]
    handle.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert next(model.parameters()).dtype == torch.float32
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
    assert all(len(o.token_ids) == 10 for o in batch)


@pytest.mark.parametrize("inline", [True, False])
def test_inline_generation_runs_on_the_calling_thread_with_the_same_results(inline):
    """``inline=True`` (the RL trainer, the evaluation) generates on the event loop's own thread, so
    torch keeps one OpenMP team; the default hands the batch to a worker thread (a server's loop
    stays free). Either way the sampled ids are the same."""
    import asyncio
    import threading

    be = HFBackend(tiny_model(), tiny_tokenizer(), max_batch_size=8, inline=inline)
    seen: list[int] = []
    original = be.generate_batch

    def spy(requests):
        seen.append(threading.get_ident())
        return original(requests)

    be.generate_batch = spy
    reqs = [req(p, max_tokens=6, temperature=1.0, seed=11) for p in PROMPTS]
    caller = threading.get_ident()
    outs = asyncio.run(be.agenerate(reqs))
    assert len(seen) == 1 and (seen[0] == caller) is inline
    reference = HFBackend(tiny_model(), tiny_tokenizer(), max_batch_size=8).generate_batch(reqs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert any(o.token_ids != outs[0].token_ids for o in outs[1:])  # sampled rows differ: the check compares something


def test_the_sampler_draws_each_index_at_its_probability_and_never_a_zero_one():
    """``_sample_rows`` (inverse CDF at one uniform per row; replaced ``torch.multinomial``): over
    20,000 rows of ``[0.1, 0, 0.4, 0.2, 0.3]`` each frequency is within 0.015 of its probability
    (about 4 standard deviations) and index 1 never comes; a row's draw depends only on its own
    probabilities and uniform; a uniform at the top of [0, 1) takes the last non-zero entry."""
    from r3rag.rollout.backends.hf import _sample_rows

    probs = torch.tensor([0.1, 0.0, 0.4, 0.2, 0.3]).expand(20_000, 5)  # (n, V)
    u = torch.rand(20_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (n,)
    idx = _sample_rows(probs, u)  # (n,)
    freq = torch.bincount(idx, minlength=5) / 20_000
    assert freq[1] == 0
    assert torch.allclose(freq, probs[0], atol=0.015), freq
    # by hand: cumulative [0.1, 0.1, 0.5, 0.7, 1.0]; 0.05 -> 0, 0.1 -> 2 (never the zero entry), 0.69 -> 3
    hand = torch.tensor([[0.1, 0.0, 0.4, 0.2, 0.3]] * 3)
    assert _sample_rows(hand, torch.tensor([0.05, 0.1, 0.69], dtype=torch.float64)).tolist() == [0, 2, 3]
    one_hot = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    assert _sample_rows(one_hot, torch.tensor([0.999999], dtype=torch.float64)).tolist() == [2]
    # rounding: a total just under the uniform's share takes the last non-zero entry, never the zero tail
    short = torch.tensor([[0.5, 0.25, 0.0]], dtype=torch.float32)
    assert _sample_rows(short, torch.tensor([1.0], dtype=torch.float64)).tolist() == [1]
    # a row alone or among others: the same index
    mixed = torch.stack([probs[0], torch.tensor([0.0, 0.0, 0.0, 0.5, 0.5])])
    uu = torch.tensor([0.42, 0.42], dtype=torch.float64)
    assert _sample_rows(mixed, uu)[0] == _sample_rows(probs[:1], uu[:1])[0]


def test_top_p_keeps_each_rows_own_nucleus():
    from r3rag.rollout.backends.hf import _top_p

    probs = torch.tensor([[0.1, 0.5, 0.15, 0.25], [0.1, 0.5, 0.15, 0.25], [0.25, 0.25, 0.25, 0.25]])  # (3, V)
    out = _top_p(probs, torch.tensor([0.6, 0.7, 0.3]))  # (3, V)
    # row 0: 0.5 kept (mass before it 0), 0.25 kept (0.5 < 0.6), 0.15 not (0.75): 0.5/0.75, 0.25/0.75
    assert torch.allclose(out[0], torch.tensor([0.0, 2 / 3, 0.0, 1 / 3]))
    # row 1: the same row with 0.7: still two entries (0.75 >= 0.7)
    assert torch.allclose(out[1], out[0])
    # row 2: ties, 0.3: the first two in index order (stable sort), renormalised
    assert torch.allclose(out[2], torch.tensor([0.5, 0.5, 0.0, 0.0]))


def test_every_kind_of_row_in_one_batch_equals_each_alone(backend):
    """The batched picker (one softmax, top-p and draw over all sampling rows) against each request
    generated alone: greedy, sampled, sampled with top-p, and teacher-forced rows mixed."""
    reqs, free = mixed_requests(backend, PROMPTS)
    batch = backend.generate_batch(reqs)
    alone = [backend.generate_batch([r])[0] for r in reqs]
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]
    for b, a in zip(batch, alone):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-5)
    assert batch[1].token_ids != batch[2].token_ids  # same seed, other distribution: the rows are not copies
    assert batch[3].token_ids == free.token_ids and batch[3].logprobs == pytest.approx(free.logprobs, abs=1e-5)


def _late_stop(text: str, ending: str) -> str:
    """Three characters of ``text`` from its 15th on: any three, or the first three that end in a space."""
    if ending == "space":
        k = text.index(" ", 14)
        return text[k - 2:k + 1]
    return text[14:17]


@pytest.mark.parametrize("ending", ["any", "space"])
def test_stop_checks_only_where_a_token_can_end_a_stop_and_find_the_same_stops(ending, monkeypatch):
    """A row's tail is decoded only after a token whose text holds a stop string's last
    character; the outputs equal those of checking after every token."""
    from r3rag.rollout.backends import hf

    be = HFBackend(tiny_model(), tiny_tokenizer(), max_batch_size=8)
    frees = be.generate_batch([req(p, max_tokens=24, temperature=1.0, seed=11) for p in PROMPTS])
    stops = sorted({_late_stop(f.text, ending) for f in frees})
    reqs = [req(p, max_tokens=24, temperature=1.0, seed=11, stop=stops) for p in PROMPTS]
    decodes = {"n": 0}
    real_decode = be.tokenizer.decode

    def counting(ids, *a, **kw):
        decodes["n"] += len(ids) > 1  # a tail, not one token's own text
        return real_decode(ids, *a, **kw)

    monkeypatch.setattr(be.tokenizer, "decode", counting)
    gated = be.generate_batch(reqs)
    gated_tails = decodes["n"]
    monkeypatch.setattr(hf.HFBackend, "_may_end_stop", lambda self, tok, stops: True)
    decodes["n"] = 0
    every = be.generate_batch(reqs)
    assert [(o.token_ids, o.finish_reason, o.stop_string) for o in gated] == \
           [(o.token_ids, o.finish_reason, o.stop_string) for o in every]
    assert any(o.finish_reason == "stop" for o in gated)  # the stops were found: the check compares something
    assert gated_tails < decodes["n"]  # ... and the gate skipped some tails


def test_a_tokenizer_that_does_not_decode_piece_by_piece_checks_every_token():
    """SentencePiece-style decoding drops a token's leading space when it is decoded alone, so a
    token's own text cannot tell whether it ends a stop string: every tail is checked."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from r3rag.rollout.backends.hf import _decodes_piecewise

    spm = Tokenizer(models.BPE(unk_token="<unk>"))
    spm.pre_tokenizer, spm.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    spm.train_from_iterator(["Step 1: the query is here\nStep 2: more words"] * 20,
                            trainer=trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"], show_progress=False))
    fast = PreTrainedTokenizerFast(tokenizer_object=spm, unk_token="<unk>")
    assert _decodes_piecewise(tiny_tokenizer()) and not _decodes_piecewise(fast)
    be = HFBackend(tiny_model(), tiny_tokenizer())
    be.tokenizer = fast
    assert all(be._may_end_stop(i, ["Step 1"]) for i in range(len(fast)))
    be = HFBackend(tiny_model(), tiny_tokenizer())
    letters = [i for i in range(300) if "x" not in be.tokenizer.decode([i])]
    assert not any(be._may_end_stop(i, ["ax"]) for i in letters)
    assert all(be._may_end_stop(i, ["é"]) for i in letters)  # a non-ASCII end: always checked

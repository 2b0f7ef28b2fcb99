"""Shared prompt prefixes: where the shared part ends (from the caller's renderer), the bounded
store, and that starting rows from a shared prefix changes no token, leaves log-probs within float
rounding of one unsplit prefill, and makes one-at-a-time results independent of what ran before."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import CORPUS, QUESTIONS, tiny_model, tiny_tokenizer

from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.hf import HFBackend
from r3rag.rollout.backends.shared_prefix import SENTINELS, SharedPrefixes, common_prefix_len, shared_prefix_len
from r3rag.rollout.tokens import encode

torch.set_num_threads(1)
SYSTEM = "Step 1:\nThe problem analysis: answer the question by searching the documents, one step per reply. "
ASKED = ["Where was Varnel Oskaro born?", "Who founded Melvane Works?", "When did Quessa become a city?"]


def _req(question: str, shared: int, max_tokens: int = 8, temperature: float = 0.0, seed: int | None = None) -> GenerationRequest:
    text = SYSTEM + question
    ids = encode(tiny_tokenizer(), text)
    return GenerationRequest(ids, text, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
                             shared_prefix=shared)


def _n_shared() -> int:
    return shared_prefix_len(lambda i: encode(tiny_tokenizer(), SYSTEM + SENTINELS[i]))


# ---- where the shared part ends ------------------------------------------------------------------
def test_common_prefix_len_edges():
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2
    assert common_prefix_len([3], [1, 3]) == 0


def test_shared_prefix_len_stops_before_the_variable_part_with_a_margin():
    n = _n_shared()
    system_ids = encode(tiny_tokenizer(), SYSTEM)
    assert 16 <= n <= len(system_ids)
    for q in ASKED:  # every real prompt starts with the same n ids
        assert encode(tiny_tokenizer(), SYSTEM + q)[:n] == system_ids[:n]
    assert shared_prefix_len(lambda i: [5, 5, 5][: i + 1], margin=0) == 1
    assert shared_prefix_len(lambda i: [i], margin=2) == 0


def test_engine_and_baselines_put_the_shared_length_on_their_requests():
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats import get_format
    from r3rag.testing.fake_retriever import OverlapRetriever

    tok = tiny_tokenizer()
    fmt = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    seen: list[GenerationRequest] = []

    class Spy(HFBackend):
        def generate_batch(self, requests):
            seen.extend(requests)
            return super().generate_batch(requests)

    engine = RolloutEngine(Spy(tiny_model(), tok), OverlapRetriever(CORPUS), RolloutConfig(max_steps=1), fmt=fmt)
    prompts = [encode(tok, fmt.render_prompt(q.question)) for q in QUESTIONS]
    assert engine.shared_prefix >= 16
    assert all(p[: engine.shared_prefix] == prompts[0][: engine.shared_prefix] for p in prompts)
    assert common_prefix_len(prompts[0], prompts[1]) - engine.shared_prefix <= 3  # the margin, a word at most
    engine.run(QUESTIONS)
    assert seen and all(r.shared_prefix == engine.shared_prefix for r in seen)


# ---- the store -----------------------------------------------------------------------------------
def test_key_for_caps_at_the_last_token_and_respects_min_tokens():
    sp = SharedPrefixes(min_tokens=3)
    assert sp.key_for([1, 2, 3, 4, 5], 3) == (1, 2, 3)
    assert sp.key_for([1, 2, 3, 4], 9) == (1, 2, 3)
    assert sp.key_for([1, 2, 3, 4], 2) is None and sp.key_for([1, 2, 3, 4], 0) is None
    assert SharedPrefixes(min_tokens=0).key_for([1, 2, 3, 4], 3) is None  # off


def test_store_is_lru_bounded_in_slots_and_bytes():
    sp = SharedPrefixes(min_tokens=2, slots=2, max_bytes=100)
    assert sp.store((1, 2), "a", nbytes=40) and sp.store((3, 4), "b", nbytes=40)
    assert sp.get((1, 2)) == "a"  # touch: (3, 4) is now the oldest
    assert sp.store((5, 6), "c", nbytes=10)  # a third slot: (3, 4) goes
    assert sp.get((3, 4)) is None and sp.get((1, 2)) == "a" and sp.nbytes == 50
    assert sp.store((7, 8), "d", nbytes=50)  # a third slot again: (5, 6), the oldest, goes
    assert sp.nbytes == 90 and sp.get((5, 6)) is None and sp.get((7, 8)) == "d"
    assert sp.store((3, 3), "e", nbytes=50)  # slots evict (1, 2); 100 bytes fit: (7, 8) stays
    assert len(sp) == 2 and sp.nbytes == 100
    assert sp.store((4, 4), "f", nbytes=60)  # slots evict (7, 8); 110 > 100 bytes: (3, 3) goes too
    assert len(sp) == 1 and sp.nbytes == 60 and sp.get((4, 4)) == "f"
    assert not sp.store((9, 9), "huge", nbytes=101) and len(sp) == 1  # never kept, nothing evicted
    assert sp.hits == 4 and sp.tokens_reused == 8
    sp.clear()
    assert sp.nbytes == 0 and len(sp) == 0


# ---- the backend ---------------------------------------------------------------------------------
def _run(shared_tokens: int, alone: bool, order: list[int] | None = None) -> tuple[list, HFBackend]:
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=shared_tokens)
    n = _n_shared()
    reqs = [_req(q, n) for q in ASKED] + [_req(ASKED[0], n, temperature=0.9, seed=4)]
    order = order or list(range(len(reqs)))
    reqs = [reqs[i] for i in order]
    outs = [be.generate_batch([r])[0] for r in reqs] if alone else be.generate_batch(reqs)
    # a second turn continues each row (its own cached turn, not the shared prefix)
    more = encode(tiny_tokenizer(), " The retrieval documents: (1) Quessa.")
    second = [GenerationRequest(r.prompt_ids + o.token_ids + more, "", r.params, shared_prefix=n) for r, o in zip(reqs, outs)]
    outs += [be.generate_batch([r])[0] for r in second] if alone else be.generate_batch(second)
    back = {i: k for k, i in enumerate(order)}
    k = len(order)
    return [outs[back[i]] for i in range(k)] + [outs[k + back[i]] for i in range(k)], be


@pytest.mark.parametrize("alone", [False, True], ids=["batched", "one-at-a-time"])
def test_shared_prefix_changes_no_token(alone):
    shared, be = _run(shared_tokens=16, alone=alone)
    plain, be_off = _run(shared_tokens=0, alone=alone)
    # 4 first turns start from the prefix (computed once, then 3 store hits); second turns use
    # their own cached turn instead
    assert (be.shared.rows, be.shared.hits, len(be.shared)) == (4, 3, 1) and be_off.shared.rows == 0
    assert be.cache_hits == be_off.cache_hits == 4
    for a, b in zip(shared, plain):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 8
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)  # a split prefill: float rounding only


def test_one_at_a_time_results_do_not_depend_on_what_ran_before():
    """The property a resumed evaluation relies on: bit-identical log-probs in any order."""
    first, _ = _run(shared_tokens=16, alone=True)
    reordered, _ = _run(shared_tokens=16, alone=True, order=[2, 0, 3, 1])
    for a, b in zip(first, reordered):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_requests_without_a_shared_length_prefill_as_before():
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=16)
    outs = be.generate_batch([_req(q, 0) for q in ASKED])
    assert be.shared.rows == 0 and len(be.shared) == 0 and all(len(o.token_ids) == 8 for o in outs)


def test_clear_cache_drops_shared_prefixes():
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=16)
    be.generate_batch([_req(q, _n_shared()) for q in ASKED])
    assert len(be.shared) == 1
    be.clear_cache()
    assert len(be.shared) == 0


@pytest.mark.parametrize("name", ["direct", "rag", "ircot"])
def test_baselines_put_the_shared_length_on_their_requests(name):
    import asyncio

    from r3rag.data.records import Passage, Question
    from r3rag.evaluation.baselines import BASELINES, PromptedBaseline
    from r3rag.evaluation.config import MethodConfig
    from r3rag.rollout.config import RolloutConfig

    tok = tiny_tokenizer()
    seen: list[GenerationRequest] = []

    class Spy(HFBackend):
        def generate_batch(self, requests):
            seen.extend(requests)
            return super().generate_batch(requests)

    class Docs:
        async def asearch(self, queries, k):
            return [[Passage("p1", "Quessa is a city.")] for _ in queries]

    base = PromptedBaseline(name, BASELINES[name], Spy(tiny_model(), tok), Docs(), MethodConfig(max_steps=1, answer_max_tokens=4), RolloutConfig())
    assert base.shared_prefix >= 16
    prompts = [encode(tok, base.render_prompt(q, [Passage("p1", "Quessa is a city.")])) for q in ASKED]
    assert all(p[: base.shared_prefix] == prompts[0][: base.shared_prefix] for p in prompts)
    asyncio.run(base.arun([Question(str(i), q, ["x"]) for i, q in enumerate(ASKED)]))
    assert seen and all(r.shared_prefix == base.shared_prefix for r in seen)

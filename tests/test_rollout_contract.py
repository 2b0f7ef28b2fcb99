"""The trainer contract of a trajectory: exact ids and masks on sampled output with documents
inserted, step -> token spans, hard token budgets, infrastructure failures kept apart from the
policy's, and one environment step shared by the engine and single-episode drivers."""

from __future__ import annotations

import asyncio

import pytest
from rollout_helpers import CORPUS, QUESTIONS, ScriptedBackend, tiny_tokenizer

from r3rag.errors import NotTrainableError
from r3rag.rewards.recipes import load_recipe
from r3rag.rewards.types import summarize
from r3rag.rollout.backends.base import GenerationOutput, GenerationRequest, PolicyBackend
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.env import RetrievalEnv
from r3rag.rollout.formats import get_format
from r3rag.rollout.oracle import OracleBackend
from r3rag.rollout.tokens import decode, encode
from r3rag.rollout.trajectory import Trajectory
from r3rag.testing.fake_retriever import OverlapRetriever

CASES = [(f, m) for f in ("r3rag_steps", "r1searcher_tags") for m in ("chat", "raw")]
TWO_HOP = QUESTIONS[0]  # needs two searches


def split_one_token(tok, ids: list[int]) -> list[int]:
    """The same text with one multi-character token spelled as two shorter tokens: ids that are
    NOT the canonical encoding of their text (what a sampling model may well produce)."""
    for i, t in enumerate(ids):
        piece = decode(tok, [t])
        if len(piece) >= 3 and piece.isascii() and piece.strip() == piece:
            a, b = encode(tok, piece[:1]), encode(tok, piece[1:])
            if decode(tok, a + b) == piece and len(a + b) >= 2:
                return ids[:i] + a + b + ids[i + 1:]
    raise AssertionError("no splittable token in this turn")


class SplittingBackend(PolicyBackend):
    """The oracle's turns, each re-spelled with one token split in two; remembers what it returned."""

    name = "splitting"

    def __init__(self, inner: PolicyBackend) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.returned: list[list[int]] = []

    async def agenerate(self, requests: list[GenerationRequest]) -> list[GenerationOutput]:
        outs = await self.inner.agenerate(requests)
        got = []
        for o in outs:
            ids = split_one_token(self.tokenizer, o.token_ids)
            self.returned.append(ids)
            got.append(GenerationOutput(ids, decode(self.tokenizer, ids), [-0.5] * len(ids), o.finish_reason, o.stop_string))
        return got


@pytest.mark.parametrize("name,mode", CASES)
def test_sampled_non_canonical_ids_are_kept_and_masked_exactly(name, mode):
    tok = tiny_tokenizer()
    f = get_format(name, mode=mode, tokenizer=tok)
    backend = SplittingBackend(OracleBackend(QUESTIONS, f, tok))
    retriever = OverlapRetriever(CORPUS)
    traj = RolloutEngine(backend, retriever, RolloutConfig(format=name, mode=mode, docs_per_step=2), fmt=f).run([TWO_HOP])[0]

    assert traj.stop_reason == "answered"
    model = [s for s in traj.segments if s.role == "model"]
    env = [s for s in traj.segments if s.role == "env"]
    # every model segment holds exactly the backend's ids, which are not the canonical encoding
    assert [s.token_ids for s in model] == backend.returned
    assert all(s.token_ids != encode(tok, s.text) for s in model)
    # documents were inserted, at least two rounds of them, and the mask is 0 on every one of their tokens
    docs = [d for st in traj.steps for d in st.documents]
    assert len(env) >= 2 and docs
    mask, ids = traj.loss_mask, traj.token_ids
    pos = 0
    for seg in traj.segments:
        assert mask[pos:pos + len(seg.token_ids)] == [int(seg.role == "model")] * len(seg.token_ids)
        pos += len(seg.token_ids)
    assert sum(mask) == sum(len(r) for r in backend.returned)
    env_text = decode(tok, [t for t, m in zip(ids, mask) if m == 0][len(traj.segments[0].token_ids):])
    assert all(d.contents.split("\n", 1)[1] in env_text for d in docs)
    # one retrieval request per round that had queries, and there were such rounds
    assert len(retriever.calls) == traj.num_retrievals >= 2
    # step spans: each step owns its model segment; the step's last token closes its turn
    spans = traj.step_spans
    assert len(spans) == len(traj.steps) == len(model)
    for span, seg in zip(spans, model):
        assert ids[span.start:span.end] == seg.token_ids and span.last == span.end - 1
        assert all(mask[span.start:span.end])


def test_inexact_ids_refuse_a_loss_mask():
    t = Trajectory("q", "?", "r3rag_steps", metadata={"exact_ids": False}, stop_reason="answered")
    assert not t.trainable and not t.exact_ids
    with pytest.raises(NotTrainableError, match="not exact"):
        t.loss_mask


class TextOnlyBackend(ScriptedBackend):
    """A server that returns text only: ids re-tokenised here, flagged inexact."""

    async def agenerate(self, requests):
        outs = await super().agenerate(requests)
        for o in outs:
            o.exact_ids = False
        return outs


def test_text_only_backend_marks_trajectory_not_trainable():
    tok = tiny_tokenizer()
    script = {TWO_HOP.question: ["Step 1: The problem analysis: x\nThe final answer: Dromel"]}
    f = get_format("r3rag_steps", mode="raw", tokenizer=tok)
    traj = RolloutEngine(TextOnlyBackend(tok, script), OverlapRetriever(CORPUS), RolloutConfig(mode="raw"), fmt=f).run([TWO_HOP])[0]
    assert traj.stop_reason == "answered" and traj.metadata["exact_ids"] is False and not traj.trainable
    with pytest.raises(NotTrainableError):
        traj.loss_mask


@pytest.mark.parametrize("name", ["r3rag_steps", "r1searcher_tags"])
def test_max_total_tokens_is_a_hard_cap(name):
    tok = tiny_tokenizer()
    long_corpus = [type(p)(p.id, p.contents + " " + " ".join(["filler words about nothing"] * 40)) for p in CORPUS]
    f = get_format(name, mode="chat", tokenizer=tok)
    prompt_len = len(encode(tok, f.render_prompt(TWO_HOP.question)))
    cut_seen = False
    for extra in (40, 90, 150, 260):
        cap = prompt_len + extra
        cfg = RolloutConfig(format=name, docs_per_step=3, doc_max_chars=None, max_total_tokens=cap)
        traj = RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(long_corpus), cfg, fmt=f).run([TWO_HOP])[0]
        assert len(traj.token_ids) <= cap, (extra, len(traj.token_ids))
        cut_seen |= "documents_cut" in traj.metadata
    assert cut_seen  # the budget actually forced documents to be cut or left out


def test_backend_and_retrieval_failures_are_dropped_not_penalised():
    tok = tiny_tokenizer()

    class Broken(PolicyBackend):
        tokenizer = tok

        async def agenerate(self, requests):
            raise MemoryError("CUDA out of memory (test)")

    f = get_format("r3rag_steps", mode="raw", tokenizer=tok)
    cfg = RolloutConfig(mode="raw")
    backend_fail = RolloutEngine(Broken(), OverlapRetriever(CORPUS), cfg, fmt=f).run([TWO_HOP])[0]
    retr_fail = RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(CORPUS, fail=True), cfg, fmt=f).run([TWO_HOP])[0]
    good = RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(CORPUS), cfg, fmt=f).run([TWO_HOP])[0]
    assert (backend_fail.stop_reason, retr_fail.stop_reason, good.stop_reason) == ("backend_error", "retrieval_failed", "answered")
    for recipe in ("r3rag", "r1searcher_stage1", "r1searcher_stage2"):
        outs = load_recipe(recipe).score([backend_fail, retr_fail, good])
        assert [o.dropped for o in outs] == [True, True, False], recipe
        assert outs[0].total == outs[1].total == 0.0 and outs[2].total > 0.0, recipe
        assert summarize(outs)["reward/infra_failures"] == 2.0
        kept = load_recipe(recipe, ["infra_failure=zero"]).score([backend_fail, retr_fail])
        assert [(o.total, o.dropped) for o in kept] == [(0.0, False), (0.0, False)]


def test_stage1_counts_only_executed_queries():
    """With max_steps=1 the query is parsed but never sent: stage 1 must not pay for it."""
    tok = tiny_tokenizer()
    f = get_format("r1searcher_tags", mode="raw", tokenizer=tok)
    retriever = OverlapRetriever(CORPUS)
    cfg = RolloutConfig(format="r1searcher_tags", mode="raw", max_steps=1)
    traj = RolloutEngine(OracleBackend(QUESTIONS, f, tok), retriever, cfg, fmt=f).run([TWO_HOP])[0]
    assert traj.stop_reason == "max_steps" and traj.queries and retriever.calls == []
    out = load_recipe("r1searcher_stage1").score([traj])[0]
    assert out.components["retrieval"] == 0.0 and out.components["num_retrievals"] == 0.0 and traj.num_retrievals == 0


class FailOnCall:
    """A retriever whose n-th call fails (after the client's retries, say)."""

    def __init__(self, fail_call: int) -> None:
        self.inner = OverlapRetriever(CORPUS)
        self.fail_call = fail_call
        self.calls: list[list[str]] = []

    async def asearch(self, queries, k):
        self.calls.append(list(queries))
        if len(self.calls) == self.fail_call:
            raise ConnectionError("one call lost")
        return await self.inner.asearch(queries, k)


def test_one_failed_call_fails_only_the_trajectories_in_it():
    tok = tiny_tokenizer()
    f = get_format("r3rag_steps", mode="raw", tokenizer=tok)
    retriever = FailOnCall(2)
    trajs = RolloutEngine(OracleBackend(QUESTIONS, f, tok), retriever, RolloutConfig(mode="raw"), fmt=f).run(QUESTIONS[:2])
    by_q = {t.question_id: t for t in trajs}
    # round 1 searched for both; only q1 (two hops) searched again in round 2, the failed call
    assert len(retriever.calls[0]) == 2 and len(retriever.calls[1]) == 1
    assert by_q["q1"].stop_reason == "retrieval_failed" and by_q["q2"].stop_reason == "answered"


def test_env_step_alone_equals_the_engine():
    """The single-episode driver (what the OpenRLHF plugin calls) and the batched engine produce
    the same trajectory: one home for the rules."""
    tok = tiny_tokenizer()
    for name in ("r3rag_steps", "r1searcher_tags"):
        f = get_format(name, mode="chat", tokenizer=tok)
        cfg = RolloutConfig(format=name, docs_per_step=2)
        oracle = OracleBackend(QUESTIONS, f, tok)
        batched = RolloutEngine(oracle, OverlapRetriever(CORPUS), cfg, fmt=f).run([TWO_HOP], seed=0)[0]

        async def alone():
            env = RetrievalEnv(TWO_HOP, f, tok, cfg, OverlapRetriever(CORPUS), seed=0)
            feedback_ids: list[list[int]] = []
            while not env.done:
                out = (await oracle.agenerate([env.request()]))[0]
                res = await env.step(out)
                if res.feedback_ids:
                    feedback_ids.append(res.feedback_ids)
            return env.trajectory, feedback_ids

        single, fb = asyncio.run(alone())
        assert single.token_ids == batched.token_ids and single.stop_reason == batched.stop_reason
        assert fb == [s.token_ids for s in single.segments if s.role == "env"] and len(fb) >= 2


def test_seeds_advance_per_call_and_do_not_depend_on_batch_position():
    tok = tiny_tokenizer()
    f = get_format("r3rag_steps", mode="raw", tokenizer=tok)
    cfg = RolloutConfig(mode="raw", temperature=1.0)

    class SeedEcho(PolicyBackend):
        tokenizer = tok

        def __init__(self):
            self.seeds: dict[str, list[int]] = {}

        async def agenerate(self, requests):
            for r in requests:
                q = next(q.question for q in QUESTIONS if q.question in r.prompt_text)
                self.seeds.setdefault(q, []).append(r.params.seed)
            return [GenerationOutput([], "", None, "error", error="stop here") for _ in requests]

    b = SeedEcho()
    eng = RolloutEngine(b, OverlapRetriever(CORPUS), cfg, fmt=f)
    eng.run(QUESTIONS[:2])  # call 0
    eng.run(QUESTIONS[:2])  # call 1: fresh seeds
    eng.run(list(reversed(QUESTIONS[:2])), seed=0)  # explicit seed 0, other positions
    s1 = b.seeds[QUESTIONS[0].question]
    assert s1[0] != s1[1]  # a trainer's next iteration samples anew
    assert s1[2] == s1[0]  # same run seed, other batch position: same seed


def test_question_gold_ids_reach_the_process_reward():
    """A rollout's trajectory carries the question's gold supporting ids (here only in the
    decomposition), so R3-RAG's gold process reward scores each query step from the trajectory
    alone: the step that found p1 and the step that found p2 each earn relevance, nothing is
    reported missing. Without the ids every query step scored 0 and the judge counted missing."""
    tok = tiny_tokenizer()
    f = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    traj = RolloutEngine(OracleBackend(QUESTIONS, f, tok), OverlapRetriever(CORPUS),
                         RolloutConfig(format="r3rag_steps", docs_per_step=1), fmt=f).run([TWO_HOP])[0]
    assert traj.stop_reason == "answered" and traj.answer == "Dromel"
    assert traj.metadata["supporting_ids"] == ["p1", "p2"]
    assert [d.id for s in traj.steps for d in s.documents] == ["p1", "p2"]

    out = load_recipe("r3rag").score([traj])[0]
    query_steps = [i for i, s in enumerate(traj.steps) if s.query]
    assert len(query_steps) == 2
    # relevance 1.0 x fate 1.6 (correct answer) on each query step; +2.0 on the answer step
    assert [out.per_step[i] for i in query_steps] == [pytest.approx(1.6), pytest.approx(1.6)]
    assert out.per_step[-1] == pytest.approx(2.0)
    assert out.missing == []
    # the same trajectory stripped of its ids scores its query steps 0: the check above can fail
    traj.metadata.pop("supporting_ids")
    assert [load_recipe("r3rag").score([traj])[0].per_step[i] for i in query_steps] == [0.0, 0.0]

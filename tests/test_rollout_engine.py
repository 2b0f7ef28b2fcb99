"""The rollout engine: one retrieval call per round, budgets, stop reasons, streaming, JSONL."""

from __future__ import annotations

import asyncio
import json

import pytest
from rollout_helpers import CORPUS, QUESTIONS, ScriptedBackend, tiny_tokenizer

from r3rag.rollout.backends.base import PolicyBackend
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import get_format
from r3rag.rollout.io import read_trajectories
from r3rag.rollout.oracle import OracleBackend
from r3rag.rollout.trajectory import STOP_REASONS
from r3rag.testing.fake_retriever import OverlapRetriever

Q1 = QUESTIONS[0].question


def oracle_engine(cfg: RolloutConfig, retriever=None, questions=QUESTIONS):
    tok = tiny_tokenizer()
    f = get_format(cfg.format, mode=cfg.mode, tokenizer=tok)
    return RolloutEngine(OracleBackend(questions, f, tok), retriever or OverlapRetriever(CORPUS), cfg, fmt=f)


def scripted(texts: list[str], cfg: RolloutConfig, retriever=None, **kw):
    be = ScriptedBackend(tiny_tokenizer(), {Q1: texts}, **kw)
    return be, RolloutEngine(be, retriever or OverlapRetriever(CORPUS), cfg)


def query(q: str) -> str:
    return f"Step 1:\nThe problem analysis: need more.\nThe retrieval query: {q}<|im_end|>"


def test_one_retrieval_call_per_round_with_all_queries():
    r = OverlapRetriever(CORPUS)
    trajs = oracle_engine(RolloutConfig(n_samples=2, docs_per_step=2), r).run(QUESTIONS)
    assert len(trajs) == 6 and [t.sample_index for t in trajs] == [0, 1] * 3
    # round 1: the first sub-question of all three questions (two samples each, de-duplicated);
    # round 2: q1's second hop only; round 3: answers, no retrieval
    assert [sorted(c[0]) for c in r.calls] == [
        sorted(["Where was Varnel Oskaro born?", "Who founded Melvane Works?", "Who founded Zorvik Hall?"]),
        ["In which province is the town Quessa?"],
    ]
    assert {t.stop_reason for t in trajs} == {"answered"}
    step = trajs[0].steps[0]
    assert step.documents[0].id == "p1" and step.documents[0].score is not None


def test_retrieval_failure_marks_trajectories_and_does_not_raise():
    trajs = oracle_engine(RolloutConfig(), OverlapRetriever(CORPUS, fail=True)).run(QUESTIONS)
    assert [t.stop_reason for t in trajs] == ["retrieval_failed"] * 3
    assert "retriever is down" in trajs[0].metadata["retrieval_error"]


class WrongCount:
    async def asearch(self, queries, k):
        return []


def test_retriever_with_a_bad_reply_is_a_failure_too():
    trajs = oracle_engine(RolloutConfig(), WrongCount()).run(QUESTIONS[:1])
    assert trajs[0].stop_reason == "retrieval_failed"


@pytest.mark.parametrize(
    "text,error",
    [
        ("I have no idea what to do", "no_marker"),
        ("The retrieval query: a\nThe final answer: b<|im_end|>", "query_and_answer"),
        ("Step 1: " + "loop loop loop " * 8, "repetition"),
    ],
)
def test_malformed_output_is_a_format_error_with_raw_text(text, error):
    be, eng = scripted([text], RolloutConfig())
    t = eng.run(QUESTIONS[:1])[0]
    assert t.stop_reason == "format_error" and t.steps[0].format_error == error
    assert t.steps[0].raw == text


def test_backend_exception_is_contained():
    class Broken(PolicyBackend):
        tokenizer = tiny_tokenizer()

        async def agenerate(self, requests):
            raise RuntimeError("GPU on fire")

    t = RolloutEngine(Broken(), OverlapRetriever(CORPUS), RolloutConfig()).run(QUESTIONS[:1])[0]
    # the infrastructure's fault: its own stop reason, no step without a segment, not trainable
    assert t.stop_reason == "backend_error" and "GPU on fire" in t.metadata["backend_error"]
    assert t.steps == [] and not t.trainable


def test_max_steps_and_documents_deduplicated_by_id():
    r = OverlapRetriever(CORPUS)
    be, eng = scripted([query("Varnel Oskaro born in Quessa")], RolloutConfig(max_steps=3, docs_per_step=2), r)
    t = eng.run(QUESTIONS[:1])[0]
    assert t.stop_reason == "max_steps" and len(t.steps) == 3
    ids = [[d.id for d in s.documents] for s in t.steps]
    # same query each step: later steps only get passages not shown before
    assert ids[:2] == [["p1", "p5"], ["p2", "p4"]]
    assert ids[2] == []  # the last allowed step's query is not retrieved
    assert [c[1] for c in r.calls] == [2, 4]  # k grows with what the trajectory has seen


def test_max_docs_per_trajectory_and_truncation():
    cfg = RolloutConfig(max_steps=3, docs_per_step=2, max_docs_per_trajectory=3, doc_max_chars=12)
    be, eng = scripted([query("Varnel Oskaro born Quessa")], cfg)
    t = eng.run(QUESTIONS[:1])[0]
    docs = [d for s in t.steps for d in s.documents]
    assert len(docs) == 3 and all(len(d.contents) <= 12 for d in docs)
    cfg = RolloutConfig(max_steps=2, docs_per_step=1, doc_max_chars=None, doc_max_tokens=3)
    be, eng = scripted([query("Varnel Oskaro born")], cfg)
    d = eng.run(QUESTIONS[:1])[0].steps[0].documents[0]
    assert len(tiny_tokenizer()(d.contents, add_special_tokens=False).input_ids) <= 3


def test_token_budgets():
    long_text = "Step 1:\nThe problem analysis: " + "thinking hard about it " * 3
    be, eng = scripted([long_text], RolloutConfig(max_turn_tokens=5))
    t = eng.run(QUESTIONS[:1])[0]
    assert t.stop_reason == "max_tokens" and t.num_generated_tokens == 5
    assert be.requests[0].params.max_tokens == 5
    # per-trajectory budget: each query turn is ~20 tokens; 30 allows one turn and part of the next
    n = len(tiny_tokenizer()(query("Varnel"), add_special_tokens=False).input_ids)
    be, eng = scripted([query("Varnel")], RolloutConfig(max_new_tokens=n + 4, max_steps=5))
    t = eng.run(QUESTIONS[:1])[0]
    assert t.stop_reason == "max_tokens" and t.num_generated_tokens == n + 4
    assert be.requests[1].params.max_tokens == 4


def test_per_sample_temperature_and_seed():
    be, eng = scripted([query("Varnel"), "Step 2:\nThe problem analysis: ok\nThe final answer: Quessa<|im_end|>"],
                       RolloutConfig(n_samples=3, temperatures=[0.0, 0.9]))
    trajs = eng.run(QUESTIONS[:1])
    assert [t.answer for t in trajs] == ["Quessa"] * 3
    temps = [r.params.temperature for r in be.requests]
    seeds = [r.params.seed for r in be.requests]
    assert temps[:3] == [0.0, 0.9, 0.9] and len(set(seeds)) == len(seeds) == 6


def test_streaming_yields_each_trajectory_when_it_finishes(tmp_path):
    eng = oracle_engine(RolloutConfig(docs_per_step=2))

    async def collect():
        return [t.question_id async for t in eng.astream(QUESTIONS)]

    order = asyncio.run(collect())
    assert order.index("q1") == 2  # q2 and q3 finish a round earlier than q1's two hops
    seen = []
    path = tmp_path / "out" / "traj.jsonl"
    trajs = oracle_engine(RolloutConfig(docs_per_step=2)).run(QUESTIONS, jsonl_path=path, on_finish=lambda t: seen.append(t.question_id))
    assert seen == order
    back = list(read_trajectories(path))
    assert [t.question_id for t in back] == order
    byid = {t.question_id: t for t in trajs}
    for t in back:
        assert t.to_dict() == byid[t.question_id].to_dict()
    line = json.loads(path.read_text().splitlines()[0])
    assert line["stop_reason"] in STOP_REASONS and "segments" in line


def test_stats_count_rounds_and_calls():
    eng = oracle_engine(RolloutConfig(docs_per_step=2))
    eng.run(QUESTIONS)
    assert (eng.stats.rounds, eng.stats.retrieval_calls, eng.stats.queries) == (3, 2, 4)


def test_oracle_eval_cli_help_and_bad_override(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = str(Path(__file__).resolve().parents[1] / "benchmark" / "oracle_eval.py")
    ok = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert ok.returncode == 0 and "--in-process" in ok.stdout
    bad = subprocess.run(
        [sys.executable, script, "--work", str(tmp_path), "--set", "rollout.nope=1"],
        capture_output=True, text=True,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --set: unknown key 'rollout.nope'"


def test_counts():
    t = oracle_engine(RolloutConfig(docs_per_step=2)).run(QUESTIONS[:1])[0]
    c = t.counts
    assert (c["steps"], c["retrievals"], c["documents"]) == (3, 2, 4)
    assert c["prompt_tokens"] + c["generated_tokens"] + c["env_tokens"] == len(t.token_ids)
    assert c["generated_tokens"] == sum(t.loss_mask)


def test_on_step_reports_each_step_once_when_complete():
    """on_step fires once per step; query steps only after their documents are in."""
    cfg = RolloutConfig(n_samples=2, docs_per_step=2)
    engine = oracle_engine(cfg)
    seen: list[tuple[str, int, int, int]] = []
    engine.on_step = lambda t, s: seen.append((t.question_id, t.sample_index, s.index, len(s.documents)))
    trajs = engine.run(QUESTIONS)
    expected = [(t.question_id, t.sample_index, s.index, len(s.documents)) for t in trajs for s in t.steps]
    assert len(expected) > len(trajs)  # multi-step trajectories, or the check says little
    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
    query_steps = [(t.question_id, t.sample_index, s.index) for t in trajs for s in t.steps if s.query]
    assert query_steps and all(n > 0 for (q, j, i, n) in seen if (q, j, i) in query_steps)

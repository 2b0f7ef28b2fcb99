"""The decision probes (``r3rag.evaluation.decisions``) on real oracle trajectories: a stub student
that conditions its plan count on the question and its retry on the documents is told apart from
one that learnt only the priors; batched continuation scoring equals scoring each sequence alone."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from r3rag.data.readers import read_questions
from r3rag.evaluation.decisions import COUNT_RE, continuation_probs, main, probe, teacher_openers
from r3rag.retrieval.searcher import load_searcher
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.engine import RolloutEngine
from r3rag.rollout.formats import get_format
from r3rag.rollout.oracle import OracleBackend, OracleVariety
from r3rag.rollout.retriever import SearcherRetriever
from r3rag.rollout.tiny_tokenizer import build_tiny_tokenizer
from r3rag.testing.tiny_models import build_tiny_model
from tests.sft_helpers import make_world


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Oracle trajectories of 80 small-world questions as evaluation rows (``predictions.jsonl``)."""
    w, idx = make_world(tmp_path_factory.mktemp("decisions"), size="small")
    qs = read_questions(w / "train.jsonl", limit=80)
    tok = build_tiny_tokenizer()
    fmt = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    cfg = RolloutConfig(format="r3rag_steps", docs_per_step=3)
    trajs = RolloutEngine(OracleBackend(qs, fmt, tok, variety=OracleVariety(seed=0)), SearcherRetriever(load_searcher(idx)), cfg, fmt=fmt).run(qs)
    hops = {q.id: q.metadata["hops"] for q in qs}
    return [{"id": t.question_id, "metadata": {"hops": hops[t.question_id]}, "trajectory": t.to_dict()} for t in trajs]


def _hit(row):
    t = row["trajectory"]
    return bool({d["id"] for d in t["steps"][0]["documents"]} & set(t["metadata"]["supporting_ids"]))


class StubLM:
    """A stub student: uniform logits, except on rows whose prompt ids are a key, where it writes
    that key's target token sequence (the next target token gets +``boost`` wherever the text so far
    ends with the target's first k tokens; k = 0 anywhere else). A one-token target is a fixed
    preference; a longer one is a whole wording the student 'wants' to write."""

    def __init__(self, vocab: int, targets: dict[tuple[int, ...], list[int]], boost: float = 12.0):
        self.vocab, self.targets, self.boost = vocab, targets, boost

    def __call__(self, input_ids):
        logits = torch.zeros(*input_ids.shape, self.vocab)  # (B, T, V)
        for b, seq in enumerate(input_ids.tolist()):
            for key, target in self.targets.items():
                if tuple(seq[: len(key)]) != key:
                    continue
                for t in range(max(len(key), len(seq) - 64), len(seq)):  # the scored tails are the last tokens
                    k = max((k for k in range(len(target)) if k == 0 or seq[t - k + 1 : t + 1] == target[:k]), default=0)
                    logits[b, t, target[k]] += self.boost
        return SimpleNamespace(logits=logits)


def _last_tail_token(tok, prefix, cand):
    return tok.encode(prefix + cand, add_special_tokens=False)[-1]


def test_plan_probe_tells_a_question_reading_student_from_a_prior(rows):
    tok = build_tiny_tokenizer()
    plan_rows = [r for r in rows if COUNT_RE.search(r["trajectory"]["segments"][1]["text"])]
    assert len({r["metadata"]["hops"] for r in plan_rows}) >= 3  # several hop counts, so rows can differ
    boosts = {}
    for r in plan_rows:
        seg = r["trajectory"]["segments"]
        prefix = seg[1]["text"][: COUNT_RE.search(seg[1]["text"]).start(1)]
        key = tuple(seg[0]["token_ids"])  # this question's prompt
        boosts[key] = [_last_tail_token(tok, prefix, str(r["metadata"]["hops"]))]
    reader = probe(StubLM(len(tok), boosts), tok, rows, reuse_context=False)["plan"]
    assert reader["n"] == len(plan_rows)
    assert reader["plan_accuracy"] == 1.0
    for h, v in reader["by_hops"].items():
        assert v["mean_p"][int(h) - 1] > 0.99  # (hops row) all its mass on its own count
    assert reader["plan_spread"] > 0.99

    prior = probe(StubLM(len(tok), {}), tok, rows, reuse_context=False)["plan"]  # the same distribution for every question
    rows_p = [v["mean_p"] for v in prior["by_hops"].values()]
    assert all(p == pytest.approx(rows_p[0], abs=1e-4) for p in rows_p)
    assert prior["plan_spread"] == pytest.approx(0.0, abs=1e-4)


def test_retry_probe_splits_by_whether_step_one_found_a_gold_passage(rows):
    tok = build_tiny_tokenizer()
    two = [r for r in rows if len(r["trajectory"]["steps"]) >= 2 and r["trajectory"]["steps"][0]["documents"]]
    misses = [r for r in two if not _hit(r)]
    hits = [r for r in two if _hit(r)]
    assert misses and hits  # both situations occur in the oracle's chains
    retry, _ = teacher_openers()
    # a student that opens with the first retry wording exactly when its first search missed
    target = tok.encode(" " + retry[0], add_special_tokens=False)
    s = probe(StubLM(len(tok), {tuple(r["trajectory"]["segments"][0]["token_ids"]): target for r in misses}), tok, rows, reuse_context=False)["retry"]
    assert s["miss"]["n"] == len(misses) and s["hit"]["n"] == len(hits)
    assert s["miss"]["retry_share"] > 0.99 and s["miss"]["p_retry"] > 0.5
    assert s["hit"]["retry_share"] < 0.01  # uniform logits after a hit: the short found-it openers win
    flat = probe(StubLM(len(tok), {}), tok, rows, reuse_context=False)["retry"]  # a prior: the same share after a hit and a miss
    assert flat["miss"]["retry_share"] == pytest.approx(flat["hit"]["retry_share"], rel=1e-6)


def test_batched_continuations_equal_each_sequence_scored_alone():
    """Both paths (KV cache reused, whole rows) against each candidate run alone."""
    tok = build_tiny_tokenizer()
    model = build_tiny_model(tok, seed=3)
    ctx = tok.encode("Step 1:\nThe problem analysis:", add_special_tokens=False)
    prefix = " Plan: "
    cands = ["1", "2", "3 lookups", "a much longer continuation"]
    got = continuation_probs(model, tok, ctx, prefix, cands)  # the context once, its KV cache repeated
    assert continuation_probs(model, tok, ctx, prefix, cands, reuse_context=False) == pytest.approx(got, rel=1e-4)
    for c, p in zip(cands, got):
        full = tok.encode(prefix + c, add_special_tokens=False)
        shared = tok.encode(prefix, add_special_tokens=False)
        n = next(i for i in range(len(full)) if i >= len(shared) or full[i] != shared[i])
        ids = torch.tensor([ctx + full])
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=ids).logits.float()[0], -1)  # (T, V)
        want = sum(float(lp[len(ctx) + i - 1, full[i]]) for i in range(n, len(full)))
        assert p == pytest.approx(math.exp(want), rel=1e-4)
    with pytest.raises(ValueError, match="adds no token"):
        continuation_probs(model, tok, ctx, prefix, ["2", "2"])


def test_cli_names_a_missing_predictions_file(tmp_path, capsys):
    assert main(["--model", str(tmp_path), "--predictions", str(tmp_path / "nope.jsonl")]) == 2
    assert "no predictions file" in capsys.readouterr().err


def test_grounded_verdicts_of_the_grounding_teacher_follow_the_documents(tmp_path, capsys):
    """The grounding teacher says "not in these documents" exactly when a search missed, so on its
    own trajectories the verdict counts split cleanly; the CLI reads them without a model."""
    import json

    from r3rag.evaluation.decisions import grounded_verdicts

    w, idx = make_world(tmp_path / "w", size="small")
    qs = read_questions(w / "train.jsonl", limit=80)
    tok = build_tiny_tokenizer()
    fmt = get_format("r3rag_steps", mode="chat", tokenizer=tok)
    teacher = OracleBackend(qs, fmt, tok, variety=OracleVariety(seed=0, grounding=True, waste_prob=0.0))
    trajs = RolloutEngine(teacher, SearcherRetriever(load_searcher(idx)), RolloutConfig(format="r3rag_steps", docs_per_step=3), fmt=fmt).run(qs)
    rows = [{"id": t.question_id, "trajectory": t.to_dict()} for t in trajs]
    v = grounded_verdicts(rows)
    assert v["hit"]["answered"] > 20 and v["miss"]["missing"] > 0  # both branches on real retrieval
    assert v["miss"]["missing_rate"] > 0.5 > v["hit"]["missing_rate"]
    assert v["retrievals"] == sum(t.num_retrievals for t in trajs)
    pred = tmp_path / "predictions.jsonl"
    pred.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--grounded", "--predictions", str(pred), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "verdicts.json").read_text()) == v
    # a student of the older teacher gives no grounded verdict at all
    plain = [{"trajectory": r["trajectory"]} for r in _rows_without_grounding(w, idx, qs, tok, fmt)]
    assert grounded_verdicts(plain)["hit"]["answered"] == 0


def _rows_without_grounding(w, idx, qs, tok, fmt):
    trajs = RolloutEngine(OracleBackend(qs, fmt, tok, variety=OracleVariety(seed=0)), SearcherRetriever(load_searcher(idx)),
                          RolloutConfig(format="r3rag_steps", docs_per_step=3), fmt=fmt).run(qs)
    return [{"trajectory": t.to_dict()} for t in trajs]

"""Evaluation metrics from prediction rows, the predictions file's crash repair, shards, reports."""

from __future__ import annotations

import json

import pytest

from r3rag.data.records import Question
from r3rag.errors import DataError
from r3rag.evaluation.aggregate import aggregate, bootstrap_ci, metric_columns
from r3rag.evaluation.compare import compare_runs
from r3rag.evaluation.config import parse_shard
from r3rag.evaluation.datasets import select_shard
from r3rag.evaluation.predictions import load_rows, prediction_row
from r3rag.evaluation.report import write_report
from r3rag.rollout.trajectory import Step, Trajectory


NO_JUDGE = object()


def row(index, em, f1, answer_step, num_steps, retrievals, stop="answered", hops=None, qtype=None, judge=NO_JUDGE, tokens=10):
    r = {
        "id": f"q{index}", "index": index, "question": "?", "golden_answers": ["x"], "prediction": "x" if answer_step else "",
        "scores": {"em": em, "f1": f1, "cover_em": em, "acc": em}, "answer_step": answer_step, "num_steps": num_steps,
        "num_retrievals": retrievals, "generated_tokens": tokens, "stop_reason": stop,
        "metadata": {k: v for k, v in (("hops", hops), ("type", qtype)) if v is not None},
    }
    if judge is not NO_JUDGE:
        r["judge"] = judge
    return r


ROWS = [
    # answered at step 1 (correct), step 3 (correct), step 2 (wrong, f1 0.5), never (max_steps)
    row(0, 1.0, 1.0, 1, 1, 0, hops=1, qtype="single", tokens=4),
    row(1, 1.0, 1.0, 3, 3, 2, hops=2, qtype="bridge", tokens=30),
    row(2, 0.0, 0.5, 2, 2, 1, hops=2, qtype="bridge", tokens=20),
    row(3, 0.0, 0.0, None, 4, 4, stop="max_steps", hops=3, qtype="bridge", tokens=50),
]


def test_aggregate_by_hand():
    r = aggregate(list(reversed(ROWS)), bootstrap=0)  # order of the rows must not matter
    assert r["n"] == 4
    assert r["metrics"] == {"em": 50.0, "f1": 62.5, "cover_em": 50.0, "acc": 50.0}
    assert r["answered"] == 75.0
    assert r["avg_retrievals"] == 7 / 4 and r["avg_generated_tokens"] == 26.0 and r["avg_steps"] == 2.5
    assert r["stop_reasons"] == {"answered": 75.0, "max_steps": 25.0}
    assert r["retrievals_histogram"] == {"0": 1, "1": 1, "2": 1, "4": 1}
    # cut after k steps: k=1 only q0 answered; k=2 adds q2 (wrong, f1 .5); k=3 adds q1
    steps = r["accuracy_by_steps"]
    assert steps["k"] == [1, 2, 3, 4]
    assert steps["em"] == [25.0, 25.0, 50.0, 50.0]
    assert steps["f1"] == [25.0, 37.5, 62.5, 62.5]
    assert r["by_hops"] == {
        "1": {"n": 1, "em": 100.0, "f1": 100.0, "cover_em": 100.0, "acc": 100.0},
        "2": {"n": 2, "em": 50.0, "f1": 75.0, "cover_em": 50.0, "acc": 50.0},
        "3": {"n": 1, "em": 0.0, "f1": 0.0, "cover_em": 0.0, "acc": 0.0},
    }
    assert list(r["by_type"]) == ["bridge", "single"] and r["by_type"]["bridge"]["n"] == 3
    assert "judge_acc" not in r["metrics"]


def test_cut_at_k_monotone_and_ends_at_metric():
    # an unanswered trajectory scores 0 (prediction_row); answered ones answer at step 1 + i % 5
    rows = [row(i, float(i % 3 == 0), float(i % 2), 1 + i % 5, 5, i % 5) if i % 4
            else row(i, 0.0, 0.0, None, 5, 5, stop="max_steps") for i in range(40)]
    r = aggregate(rows, bootstrap=0)
    for m in ("em", "f1", "cover_em", "acc"):
        curve = r["accuracy_by_steps"][m]
        assert all(a <= b for a, b in zip(curve, curve[1:])), (m, curve)
        assert curve[-1] == r["metrics"][m]


def test_judge_metrics_and_rule_or_judge():
    rows = [row(0, 1.0, 1.0, 1, 1, 0, judge=0.0), row(1, 0.0, 0.0, 1, 1, 0, judge=1.0),
            row(2, 0.0, 0.0, 1, 1, 0, judge=None), row(3, 0.0, 0.0, 1, 1, 0, judge=0.0)]
    r = aggregate(rows, bootstrap=0)
    # a failed judge call (None) is no verdict: that question is counted apart, never as wrong
    assert r["n"] == 3 and r["failed"] == {"judge_unavailable": 1}
    assert r["metrics"]["judge_acc"] == 33.3
    assert r["metrics"]["rule_or_judge_acc"] == 66.7  # q0 by rule, q1 by judge
    assert r["metrics"]["em"] == 33.3


def test_rows_a_service_failed_for_are_left_out_and_counted_apart():
    clean = [row(0, 1.0, 1.0, 1, 1, 1), row(1, 0.0, 0.0, 1, 1, 1)]
    dead = [row(2, 0.0, 0.0, None, 1, 0, stop="retrieval_failed"), row(3, 0.0, 0.0, None, 1, 0, stop="backend_error"),
            row(4, 0.0, 0.0, None, 0, 0, stop="retrieval_failed")]
    r = aggregate(clean + dead, bootstrap=50)
    assert r["failed"] == {"retrieval_failed": 2, "backend_error": 1}
    assert {k: v for k, v in r.items() if k != "failed"} == aggregate(clean, bootstrap=50)
    assert "failed" not in aggregate(clean, bootstrap=0)


def test_bootstrap_interval_brackets_mean_and_is_deterministic():
    rows = [row(i, float(i < 30), float(i < 30), 1, 1, 0) for i in range(100)]
    cols = metric_columns(rows)
    a, b = bootstrap_ci(cols, 500, seed=3), bootstrap_ci(cols, 500, seed=3)
    assert a == b
    lo, hi = a["em"]
    assert lo < 30.0 < hi and 18.0 < lo and hi < 42.0  # binomial sd ~4.6 points
    assert bootstrap_ci({"em": cols["em"][:0]}, 500, 0) == {}
    constant = bootstrap_ci({"em": cols["em"][:30]}, 200, 0)
    assert constant["em"] == [100.0, 100.0]


def test_prediction_row_from_trajectory():
    q = Question("a", "Who?", ["Ann Lee", "A. Lee"], {"hops": 2, "type": "bridge", "decomposition": [1, 2]})
    t = Trajectory("a", "Who?", "r3rag_steps", steps=[Step(0, query="who", retrieved=True), Step(1, query="who else", retrieved=True),
                                                       Step(2, answer="the Ann Lee")], stop_reason="answered")
    r = prediction_row(7, q, t, "squad")
    assert (r["index"], r["prediction"], r["answer_step"], r["num_steps"], r["num_retrievals"]) == (7, "the Ann Lee", 3, 3, 2)
    assert r["scores"] == {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "acc": 1.0}
    assert r["metadata"] == {"hops": 2, "type": "bridge"}
    t2 = Trajectory("a", "Who?", "r3rag_steps", steps=[Step(0, query="who", retrieved=True)], stop_reason="max_steps")
    r2 = prediction_row(0, q, t2, "squad")
    assert r2["prediction"] == "" and r2["answer_step"] is None and r2["scores"]["f1"] == 0.0


def test_load_rows_cuts_a_partial_last_line(tmp_path):
    p = tmp_path / "predictions.jsonl"
    good = [json.dumps(row(i, 1.0, 1.0, 1, 1, 0)) for i in range(3)]
    p.write_text("\n".join(good) + "\n" + good[0][:25])  # a write killed half-way
    rows = load_rows(p)
    assert [r["index"] for r in rows] == [0, 1, 2]
    assert p.read_text() == "\n".join(good) + "\n"  # repaired: the next append starts on a fresh line
    p.write_text(good[0] + "\n{broken\n" + good[1] + "\n")
    with pytest.raises(DataError, match=r"predictions.jsonl:2: not a valid prediction row"):
        load_rows(p)


def test_shards_partition_positions():
    qs = [Question(str(i), "q", ["a"]) for i in range(7)]
    parts = [select_shard(qs, (i, 3)) for i in range(3)]
    assert [p for p, _ in parts[0]] == [0, 3, 6] and [p for p, _ in parts[2]] == [2, 5]
    assert sorted(p for part in parts for p, _ in part) == list(range(7))
    assert parse_shard("2/3") == (2, 3)
    for bad in ("3/3", "1", "a/b", "0/0"):
        with pytest.raises(ValueError):
            parse_shard(bad)


def test_report_and_compare_files(tmp_path):
    results = {"dataset": "world", "method": "oracle", "model": "oracle", "normalization": "squad",
               **aggregate(ROWS, bootstrap=50)}
    a, b = tmp_path / "a", tmp_path / "b"
    for d, method in ((a, "oracle"), (b, "rag")):
        d.mkdir()
        (d / "results.json").write_text(json.dumps({**results, "method": method}))
        written = write_report(d, {**results, "method": method})
        assert {p.name for p in written} == {"report.md", "results.csv", "accuracy_by_steps.png",
                                              "retrievals_histogram.png", "accuracy_by_hops.png"}
        assert all(p.stat().st_size > 0 for p in written)
    md = (a / "report.md").read_text()
    assert "| world | oracle | oracle | 4 | 50.0 [" in md and "### By hop count" in md
    assert (a / "accuracy_by_steps.png").read_bytes()[:4] == b"\x89PNG"
    table = compare_runs([a, b], tmp_path / "cmp")
    assert table.count("| world |") == 2 and "| rag |" in table
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    header = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()[0]
    assert header.startswith("dataset,method,model,n,em,em_ci_low,em_ci_high")
    with pytest.raises(DataError, match="no results.json"):
        compare_runs([tmp_path / "missing"])

"""r3rag.evaluation.evidence: evidence found vs answers read, worked out by hand on literal rows."""

from __future__ import annotations

import json

import pytest

from r3rag.evaluation.evidence import evidence_records, evidence_transitions, main, question_evidence, summarise


def _row(qid, em, steps, gold=("g1", "g2"), hops=2, index=0):
    meta = {"supporting_ids": list(gold), "hops": hops} if gold else {}
    return {"id": qid, "index": index, "scores": {"em": em}, "metadata": {"hops": hops},
            "trajectory": {"metadata": meta, "steps": steps}}


def _q(query, *doc_ids, retrieved=True):
    return {"query": query, "answer": None, "documents": [{"id": d} for d in doc_ids], "retrieved": retrieved}


def _a(answer):
    return {"query": None, "answer": answer, "documents": [], "retrieved": False}


# q1: first search misses, the agent searches again and finds both: all gold, 1 miss repaired.
# q2: first search finds g1, the second repeats it (no new gold), then it answers: 1 miss, not repaired.
# q3: a search whose documents were all shown before (dedupe: none new, but retrieved) is a miss;
#     the query of the last step was never sent (max_steps) and counts as nothing.
Q1 = _row("q1", 1.0, [_q("a", "x"), _q("b", "g1", "g2"), _a("Ann")], index=0)
Q2 = _row("q2", 0.0, [_q("a", "g1", "y"), _q("b", "g1x"), _a("Bob")], index=1)
Q3 = _row("q3", 0.0, [_q("a", "g1"), _q("b"), _q("c", retrieved=False)], gold=("g1",), hops=1, index=2)
NO_GOLD = _row("q4", 1.0, [_q("a", "x"), _a("Cy")], gold=(), index=3)


def test_question_evidence_by_hand():
    e1, e2, e3 = (question_evidence(r) for r in (Q1, Q2, Q3))
    assert (e1.searches, e1.first_hit, e1.all_gold, e1.misses, e1.researched) == (2, False, True, 1, 1)
    assert (e2.searches, e2.first_hit, e2.all_gold, e2.misses, e2.researched) == (2, True, False, 1, 0)
    # q3: the empty retrieved search is a miss followed by another search; the unsent one is not a search
    assert (e3.searches, e3.first_hit, e3.all_gold, e3.misses, e3.researched) == (2, True, True, 1, 1)
    assert e3.hops == 1 and e1.em == 1.0
    assert question_evidence(NO_GOLD) is None


def test_a_miss_at_the_last_step_has_no_chance_to_be_repaired():
    # the search at the last step brought nothing new and the episode ended: not counted as a miss
    e = question_evidence(_row("q", 0.0, [_q("a", "g1"), _q("b", "z")]))
    assert (e.searches, e.misses, e.all_gold) == (2, 0, False)


def test_summarise_overall_and_by_hops():
    recs = evidence_records([Q1, Q2, Q3, NO_GOLD])
    assert [e.id for e in recs] == ["q1", "q2", "q3"]
    s = summarise(recs)
    assert set(s) == {"all", "1", "2"}
    a = s["all"]
    assert a["n"] == 3
    assert a["em"] == pytest.approx(33.3)
    assert a["searches"] == 2.0
    assert a["first_hit"] == pytest.approx(66.7)  # q2, q3
    assert a["all_gold"] == pytest.approx(66.7)  # q1, q3
    assert a["em_all_gold"] == 50.0  # q1 right, q3 wrong
    assert a["em_not_all_gold"] == 0.0  # q2
    assert a["misses"] == 3 and a["researched"] == pytest.approx(66.7)  # q1 and q3 searched again, q2 did not
    two = s["2"]
    assert (two["n"], two["em"], two["first_hit"], two["all_gold"], two["researched"]) == (2, 50.0, 50.0, 50.0, 50.0)
    assert s["1"]["em_not_all_gold"] is None  # no 1-hop question missed its gold passage


def test_transitions_split_the_changed_answers_by_evidence():
    before = evidence_records([Q1, Q2, Q3])
    # after: q1 lost its evidence and its answer; q2 found both passages and answered right; q3 the same
    after = evidence_records([
        _row("q1", 0.0, [_q("a", "x"), _a("Ann")]),
        _row("q2", 1.0, [_q("a", "g1"), _q("b", "g2"), _a("Bob")]),
        Q3,
        _row("q9", 1.0, [_q("a", "g1", "g2"), _a("Zed")]),  # only in B: not paired
    ])
    t = evidence_transitions(before, after)
    assert t["found->lost"] == {"n": 1, "to_right": 0, "to_wrong": 1, "net": -1}
    assert t["lost->found"] == {"n": 1, "to_right": 1, "to_wrong": 0, "net": 1}
    assert t["found->found"] == {"n": 1, "to_right": 0, "to_wrong": 0, "net": 0}
    assert t["lost->lost"]["n"] == 0
    assert sum(c["n"] for c in t.values()) == 3


def _write_run(folder, rows):
    folder.mkdir()
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_cli_tables_rows_and_json(tmp_path, capsys):
    a = _write_run(tmp_path / "sft", [Q1, Q2, Q3])
    b = _write_run(tmp_path / "rl", [dict(Q1, scores={"em": 0.0}), Q2, Q3])
    assert main([a, b]) == 0
    out = capsys.readouterr().out
    assert "| all | 3 | 33.3 | 2.00 | 66.7 | 66.7 | 50.0 | 0.0 | 66.7 |" in out
    assert "| 1 | 1 | 0.0 | 2.00 | 100.0 | 100.0 | 0.0 | - | 100.0 |" in out  # q3 alone: it found its passage
    assert "| found->found | 2 | 0 | 1 | -1 |" in out  # q1 kept its evidence and lost its answer
    assert main([a, "--rows", "1:", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["runs"][a]["all"]["n"] == 2 and "transitions" not in got


def test_cli_refuses_runs_without_gold_ids(tmp_path, capsys):
    a = _write_run(tmp_path / "real", [NO_GOLD])
    assert main([a]) == 2
    assert "no question with gold passage ids" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    assert "no predictions.jsonl" in capsys.readouterr().err


def test_report_section_rows_and_transitions():
    from r3rag.evaluation.evidence import report_lines

    after = [dict(Q1, scores={"em": 0.0}), Q2, Q3]
    lines = report_lines({"SFT": [Q1, Q2, Q3], "RL": after})
    text = "\n".join(lines)
    assert lines[0] == "## Evidence found and answers read"
    assert "| SFT | 3 | 33.3 | 2.00 | 66.7 | 66.7 | 50.0 | 0.0 | 66.7 |" in text
    assert "| RL | 3 | 0.0 | 2.00 | 66.7 | 66.7 | 0.0 | 0.0 | 66.7 |" in text
    assert "| found->found | 2 | 0 | 1 | -1 |" in text
    # a model whose questions have no gold ids (a real benchmark) adds nothing
    assert report_lines({"SFT": [NO_GOLD]}) == []

"""``r3rag.evaluation.replicates``: B - A over several training runs of B, runs and questions resampled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from r3rag.errors import DataError
from r3rag.evaluation.paired import paired_differences
from r3rag.evaluation.replicates import (control_differences, crossed_bootstrap, crossed_bootstrap_two,
                                         difference_matrix, main, replicate_differences)


def _rows(ems, ids=None):
    ids = ids or [f"q{i}" for i in range(len(ems))]
    return [{"id": i, "index": k, "scores": {"em": float(e), "f1": float(e), "cover_em": float(e)},
             "num_retrievals": 1 + int(e), "stop_reason": "answered"} for k, (i, e) in enumerate(zip(ids, ems))]


def _run(folder, ems, ids=None):
    folder.mkdir(parents=True)
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(ems, ids)))
    return folder


def test_the_matrix_pairs_each_run_with_a_on_the_questions_every_run_answered():
    a = _rows([0, 1, 0, 1])
    b1 = _rows([1, 1, 0, 0])
    b2 = _rows([1, 1, 1], ids=["q0", "q2", "q3"])  # never answered q1: q1 leaves every run's row
    d = difference_matrix(a, [b1, b2], names=("em", "retrievals"))
    assert d["em"].shape == (2, 3)  # (runs, questions q0 q2 q3)
    assert d["em"].tolist() == [[100.0, 0.0, -100.0], [100.0, 100.0, 0.0]]
    assert d["retrievals"].tolist() == [[1.0, 0.0, -1.0], [1.0, 1.0, 0.0]]


def test_a_constant_difference_has_a_zero_width_interval():
    d = np.full((3, 20), 5.0)  # (runs, questions)
    assert crossed_bootstrap(d, resamples=200) == [5.0, 5.0]


def test_runs_that_disagree_widen_the_interval_that_questions_alone_would_call_exact():
    # run 0 is +10 on every question, run 1 is -10 on every question. Averaged over the runs first,
    # every question's difference is 0 and a questions-only bootstrap says [0, 0]. Resampling the
    # runs draws (0, 0) with probability 1/4, (1, 1) with 1/4, so the 2.5% and 97.5% points are -10 and +10.
    d = np.array([[10.0] * 30, [-10.0] * 30])  # (runs=2, questions=30)
    assert crossed_bootstrap(d, resamples=1000, seed=3) == [-10.0, 10.0]
    a = _rows([0] * 30)
    up = [dict(r, scores={"em": 0.1, "f1": 0.0, "cover_em": 0.0}) for r in a]
    down = [dict(r, scores={"em": -0.1, "f1": 0.0, "cover_em": 0.0}) for r in a]
    out = replicate_differences(a, [up, down], names=("em",), resamples=1000, seed=3)["em"]
    assert out["diff"] == 0.0 and out["per_run"] == [10.0, -10.0]
    assert out["ci95"] == [-10.0, 10.0] and not out["excludes_zero"]
    assert out["between_runs_sd"] == pytest.approx(14.142, abs=1e-3)  # sd of (10, -10), ddof 1


def test_one_run_is_the_paired_comparison():
    rng = np.random.default_rng(0)
    a, b = _rows(rng.integers(0, 2, 200)), _rows(rng.integers(0, 2, 200))
    one = replicate_differences(a, [b], names=("em",), resamples=2000)["em"]
    two = paired_differences(a, b, resamples=2000, names=("em",))["em"]
    assert one["diff"] == two["diff"] and one["per_run"] == [two["diff"]] and one["between_runs_sd"] == 0.0
    # different random draws of the same bootstrap: the interval ends agree to well under a point of EM
    assert one["ci95"] == pytest.approx(two["ci95"], abs=1.0)


def test_replicates_that_agree_keep_an_interval_above_zero(tmp_path, capsys):
    # 3 runs, each +3 of 20 questions right (different questions in each), A answers none right
    a = _run(tmp_path / "sft", [0] * 20)
    runs = [_run(tmp_path / f"rl{s}", [1 if i in (s, s + 5, s + 10) else 0 for i in range(20)]) for s in range(3)]
    assert main([str(a), *map(str, runs), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)["em"]
    assert d["diff"] == 15.0 and d["per_run"] == [15.0, 15.0, 15.0] and d["runs"] == 3 and d["n"] == 20
    assert d["between_runs_sd"] == 0.0 and d["ci95"][0] > 0 and d["excludes_zero"]
    assert main([str(a), *map(str, runs)]) == 0
    table = capsys.readouterr().out
    assert "over 3 run(s) of B on 20 questions" in table
    assert "| em | +15.00 [" in table and "| +15.00, +15.00, +15.00 | 0.00 |" in table


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    a = _run(tmp_path / "a", [1, 0])
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "no predictions.jsonl" in capsys.readouterr().err
    other = _run(tmp_path / "other", [1], ids=["different"])
    assert main([str(a), str(a), str(other)]) == 2
    assert "share no question ids" in capsys.readouterr().err
    assert main([str(a), str(a), "--resamples", "0"]) == 2
    assert "--resamples" in capsys.readouterr().err
    with pytest.raises(DataError, match="no B run"):
        difference_matrix(_rows([1]), [])


def test_b_against_a_null_control_is_the_difference_of_their_means():
    # 10 questions, A answers none. B's runs: 4 and 2 right (+40, +20); the control's runs: 3 and 1
    # right (+30, +10). B - control = mean(40, 20) - mean(30, 10) = 30 - 20 = +10.
    a = _rows([0] * 10)
    b = [_rows([1] * 4 + [0] * 6), _rows([1] * 2 + [0] * 8)]
    c = [_rows([1] * 3 + [0] * 7), _rows([0] * 9 + [1])]
    v = control_differences(a, b, c, names=("em", "retrievals"), resamples=300)
    assert v["em"]["diff"] == 10.0 and v["em"]["per_run"] == [40.0, 20.0] and v["em"]["control_per_run"] == [30.0, 10.0]
    assert v["retrievals"]["diff"] == pytest.approx(0.1)  # retrievals = 1 + right: the same +10 points / 100
    assert (v["em"]["runs"], v["em"]["control_runs"], v["em"]["n"]) == (2, 2, 10)
    # the same runs as B and as control: exactly zero, whatever the bootstrap draws around it
    same = control_differences(a, b, b, names=("em",), resamples=300)["em"]
    assert same["diff"] == 0.0 and same["ci95"][0] <= 0.0 <= same["ci95"][1] and not same["excludes_zero"]


def test_the_control_runs_are_resampled_too():
    # B: two runs at +50 on every question; control: one run at 0 and one at +100 on every question.
    # Averaged over the control's runs each question's control is +50, B - control = 0 on every
    # question, and a bootstrap of the questions alone would say [0, 0]. Drawing the control's two
    # runs with replacement gives (0, 0) with probability 1/4 and (100, 100) with 1/4: the 2.5% and
    # 97.5% points of B - control are +50 and -50.
    db = np.full((2, 25), 50.0)  # (B runs, questions)
    dc = np.array([[0.0] * 25, [100.0] * 25])  # (control runs, questions)
    assert crossed_bootstrap_two(db, dc, resamples=1000, seed=1) == [-50.0, 50.0]
    assert crossed_bootstrap_two(db, dc[:1], resamples=100) == [50.0, 50.0]  # one control run at 0: exact
    with pytest.raises(DataError, match="25 and 3 questions"):
        crossed_bootstrap_two(db, dc[:, :3])


def test_the_control_comparison_keeps_only_questions_every_run_answered(tmp_path, capsys):
    a = _run(tmp_path / "sft", [0, 0, 0, 0])
    b = _run(tmp_path / "rl", [1, 1, 0, 0])
    c = _run(tmp_path / "null", [1, 0, 0], ids=["q1", "q2", "q3"])  # q0 missing: it leaves B's rows too
    assert main([str(a), str(b), "--control", str(c), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["vs_a"]["em"]["diff"] == 50.0 and out["vs_a"]["em"]["n"] == 4  # B - A alone keeps all four
    v = out["vs_control"]["em"]
    assert v["n"] == 3 and v["per_run"] == [pytest.approx(100 / 3, abs=1e-3)] and v["control_per_run"] == [pytest.approx(100 / 3, abs=1e-3)]
    assert v["diff"] == 0.0
    assert main([str(a), str(b), "--control", str(c)]) == 0
    table = capsys.readouterr().out
    assert "B - control: 1 run(s) of B against 1 control run(s) on the 3 questions" in table
    assert "| em | +0.00 [" in table
    with pytest.raises(DataError, match="no control run"):
        control_differences(_rows([1]), [_rows([1])], [])

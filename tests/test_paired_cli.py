"""``python -m r3rag.evaluation.paired RUN_A RUN_B``: paired B - A of two runs, matched by question id."""

from __future__ import annotations

import json

from r3rag.evaluation.paired import main


def _run(folder, ems, ids=None):
    folder.mkdir(parents=True)
    ids = ids or [f"q{i}" for i in range(len(ems))]
    rows = [{"id": i, "index": k, "scores": {"em": e, "f1": e, "cover_em": e}, "num_retrievals": 1 + int(e), "stop_reason": "answered"}
            for k, (i, e) in enumerate(zip(ids, ems))]
    (folder / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_paired_differences_of_two_run_folders(tmp_path, capsys):
    # B gets 6 more of 10 right; B also holds a question A never answered, which must not count
    a = _run(tmp_path / "a", [0, 0, 0, 0, 0, 0, 1, 1, 0, 0])
    b = _run(tmp_path / "b", [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1], ids=[f"q{i}" for i in range(10)] + ["extra"])
    assert main([str(a), str(b), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["em"]["diff"] == 60.0 and d["em"]["n"] == 10  # (8 - 2) / 10 shared questions
    assert d["retrievals"]["diff"] == 0.6
    assert d["em"]["ci95"][0] > 0 and d["em"]["excludes_zero"]  # every changed question went up
    assert main([str(a), str(b / "predictions.jsonl")]) == 0  # a predictions file works as well as its folder
    table = capsys.readouterr().out
    assert "| em | 20.00 | 80.00 | +60.00 [" in table and "*" in table


def test_a_missing_run_is_a_clear_error(tmp_path, capsys):
    a = _run(tmp_path / "a", [1, 0])
    assert main([str(a), str(tmp_path / "nowhere")]) == 2
    assert "no predictions.jsonl" in capsys.readouterr().err
    other = _run(tmp_path / "other", [1], ids=["different"])
    assert main([str(a), str(other)]) == 2
    assert "share no question ids" in capsys.readouterr().err


def test_rows_restricts_the_comparison_to_a_slice_of_the_split(tmp_path, capsys):
    # the first 4 questions: B gains 2; questions 4..9: B loses 3, so the slices disagree in sign
    a = _run(tmp_path / "a", [0, 0, 1, 1, 1, 1, 1, 0, 0, 0])
    b = _run(tmp_path / "b", [1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    assert main([str(a), str(b), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["em"]["diff"] == -10.0  # (3 - 4) / 10 over all
    assert main([str(a), str(b), "--json", "--rows", ":4"]) == 0
    head = json.loads(capsys.readouterr().out)["em"]
    assert head["diff"] == 50.0 and head["n"] == 4  # +2 of 4
    assert main([str(a), str(b), "--json", "--rows", "4:"]) == 0
    tail = json.loads(capsys.readouterr().out)["em"]
    assert tail["diff"] == -50.0 and tail["n"] == 6 and tail["excludes_zero"]  # -3 of 6, every change down
    assert main([str(a), str(b), "--json", "--rows", "2:5"]) == 0
    assert json.loads(capsys.readouterr().out)["em"]["n"] == 3  # END excluded


def test_rows_that_select_nothing_or_do_not_parse_are_clear_errors(tmp_path, capsys):
    a = _run(tmp_path / "a", [1, 0])
    b = _run(tmp_path / "b", [1, 1])
    assert main([str(a), str(b), "--rows", "5:"]) == 2
    assert "no prediction has an index in that range" in capsys.readouterr().err
    assert main([str(a), str(b), "--rows", "three"]) == 2
    assert "expected START:END" in capsys.readouterr().err

"""`benchmark/evaluate.py score`: re-scoring prediction files with either normaliser."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r3rag.errors import DataError
from r3rag.evaluation.score import score_file

ROWS = [
    {"pred_ans": "Paris", "answer": "Paris", "judge": "True"},
    {"pred_ans": "O'Neill", "answer": "O Neill", "judge": "False"},
    {"pred_ans": "True", "answer": "yes", "judge": "True"},
    {"pred_ans": "born 1900 in Paris", "answer": ["Paris 1900"], "judge": False},
]


@pytest.fixture()
def preds(tmp_path):
    p = tmp_path / "preds.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p


def test_squad_scores_by_hand(preds):
    # row 4: pred {born,1900,in,paris} vs gold {paris,1900}: P=1/2, R=1, F1=2/3; covered, not a substring
    out = score_file(preds, normalization="squad")
    assert out == {"n": 4, "em": 25.0, "f1": round(100 * (1 + 2 / 3) / 4, 1), "cover_em": 50.0, "acc": 25.0,
                   "normalization": "squad"}


def test_r1searcher_scores_by_hand(preds):
    # rows 2 and 3 now match: "O'Neill" -> "o neill", "True" -> "yes"
    out = score_file(preds, normalization="r1searcher", judge_field="judge")
    assert out["em"] == 75.0 and out["cover_em"] == 100.0 and out["acc"] == 75.0
    assert out["f1"] == round(100 * (3 + 2 / 3) / 4, 1)
    assert out["judge_acc"] == 50.0


def test_cli_prints_one_json_object(preds, repo_root):
    r = subprocess.run([sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "score", "--predictions", str(preds),
                        "--prediction-field", "pred_ans", "--answer-field", "answer", "--normalization", "r1searcher"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["n"], out["em"], out["cover_em"]) == (4, 75.0, 100.0)


def test_cli_errors_are_one_line(preds, repo_root, tmp_path):
    cli = [sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "score", "--predictions"]
    r = subprocess.run(cli + [str(preds), "--prediction-field", "nope"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no field 'nope'" in r.stderr
    r = subprocess.run(cli + [str(tmp_path / "missing.jsonl")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "file not found" in r.stderr
    r = subprocess.run(cli + [str(preds), "--normalization", "nfkc"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_field_detection_and_bad_rows(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text(json.dumps({"prediction": "x", "golden_answers": ["x", "y"]}) + "\n")
    assert score_file(p)["em"] == 100.0
    p.write_text(json.dumps({"output": "x", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(DataError, match=r"p.jsonl:1: no prediction field"):
        score_file(p)
    p.write_text(json.dumps({"pred": "x", "answer": {"a": 1}}) + "\n")
    with pytest.raises(DataError, match="gold answer must be"):
        score_file(p)


# R1-Searcher's published table (ACC_R / ACC_L, R1-Searcher's paper and README) and the prediction files they
# released (data/eval_results/*.jsonl in their repository, MIT). They are not shipped in this
# repository; they lie in the shared data folder beside the clone (../shared/data/r1searcher/
# eval_results, see its README), which CI has. R3RAG_PUBLISHED_EVAL_RESULTS points elsewhere; when
# it is set the files must be there (a missing file is a failure, not a skip).
PUBLISHED = {
    "hotpotqa_qwen": (65.4, 75.0), "hotpotqa_llama": (64.8, 74.6),
    "bamboogle_qwen": (52.8, 54.4), "bamboogle_llama": (50.4, 54.4), "2wiki_qwen": (63.6, 65.0),
}
PUBLISHED_ENV = "R3RAG_PUBLISHED_EVAL_RESULTS"


def published_results_dir():
    import os
    from pathlib import Path

    default = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "r1searcher" / "eval_results"
    return Path(os.environ.get(PUBLISHED_ENV) or default)


def test_published_results_are_found_by_default(monkeypatch):
    from pathlib import Path

    monkeypatch.delenv(PUBLISHED_ENV, raising=False)
    assert published_results_dir() == Path(__file__).resolve().parents[2] / "shared" / "data" / "r1searcher" / "eval_results"
    monkeypatch.setenv(PUBLISHED_ENV, "/somewhere/else")
    assert published_results_dir() == Path("/somewhere/else")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_reproduces_r1searcher_published_table(name):
    import os

    path = published_results_dir() / f"{name}.jsonl"
    if not path.is_file():
        if os.environ.get(PUBLISHED_ENV):
            pytest.fail(f"{PUBLISHED_ENV}={os.environ[PUBLISHED_ENV]} holds no {path.name}")
        pytest.skip(f"{path.parent} is absent (R1-Searcher's data/eval_results; set {PUBLISHED_ENV})")
    out = score_file(path, "pred_ans", "answer", "r1searcher", judge_field="gpt4o_output")
    assert out["n"] > 0
    assert (out["cover_em"], out["judge_acc"]) == PUBLISHED[name]


def test_a_row_a_dead_service_ended_is_not_scored(tmp_path):
    from r3rag.errors import DataError
    from r3rag.evaluation.score import score_file

    path = tmp_path / "old.jsonl"
    path.write_text('{"prediction": "x", "golden_answers": ["x"], "stop_reason": "answered"}\n'
                    '{"prediction": "", "golden_answers": ["y"], "stop_reason": "retrieval_failed"}\n')
    with pytest.raises(DataError, match=r"old.jsonl:2: stop_reason 'retrieval_failed' is a service's failure"):
        score_file(path)

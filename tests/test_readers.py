"""Dataset and corpus readers, data/validate.py, and the Hugging Face converters on local files."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r3rag.data.hf_datasets import load_hf_questions
from r3rag.data.readers import iter_corpus, iter_problems, read_questions
from r3rag.errors import DataError


def write_lines(path, lines):
    path.write_bytes(b"".join((l if isinstance(l, bytes) else l.encode()) + b"\n" for l in lines))
    return path


@pytest.mark.parametrize("name", ["hotpotqa", "2wiki", "musique", "bamboogle"])
def test_reads_real_r1searcher_files(fixtures_dir, name):
    qs = read_questions(fixtures_dir / "r1searcher" / f"{name}_20.jsonl")
    assert len(qs) == 20
    assert all(q.question.strip() and q.golden_answers and q.golden_answers[0].strip() for q in qs)
    assert len({q.id for q in qs}) == 20


def test_reads_flashrag_format_and_limit(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [
        json.dumps({"id": "a", "question": "Q1?", "golden_answers": ["x", "y"], "metadata": {"hops": 2}}),
        json.dumps({"id": "b", "question": "Q2?", "golden_answers": ["z"]}),
    ])
    qs = read_questions(p)
    assert [q.id for q in qs] == ["a", "b"]
    assert qs[0].golden_answers == ["x", "y"] and qs[0].metadata == {"hops": 2}
    assert [q.id for q in read_questions(p, limit=1)] == ["a"]


def test_r1searcher_bool_and_extra_fields(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [json.dumps({"idx": 3, "question": "Is it?", "answer": True, "pred_anses": ["no"]})])
    (q,) = read_questions(p)
    assert q.id == "3" and q.golden_answers == ["yes"] and q.metadata == {"pred_anses": ["no"]}


BAD_LINES = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({"id": "a", "golden_answers": ["x"]}).encode(), "'question' must be a non-empty string"),
    (json.dumps({"id": "a", "question": "Q", "golden_answers": []}).encode(), "non-empty list"),
    (json.dumps({"id": "a", "question": "Q", "golden_answers": [{"x": 1}]}).encode(), "only strings"),
    (json.dumps({"id": "a", "question": "Q", "golden_answers": ["x"], "metadata": 3}).encode(), "'metadata' must be an object"),
    (json.dumps({"question": "Q", "text": "x"}).encode(), "not a question record"),
    (b'{"id": "a", "question": "\xff", "golden_answers": ["x"]}', "not valid UTF-8"),
]


@pytest.mark.parametrize("line,problem", BAD_LINES)
def test_bad_question_line_names_file_and_line(tmp_path, line, problem):
    good = json.dumps({"id": "ok", "question": "Q?", "golden_answers": ["x"]}).encode()
    p = write_lines(tmp_path / "d.jsonl", [good, line])
    with pytest.raises(DataError) as err:
        read_questions(p)
    assert str(err.value).startswith(f"{p}:2: ") and problem in str(err.value)


def test_duplicate_ids_and_empty_file(tmp_path):
    row = json.dumps({"id": "a", "question": "Q?", "golden_answers": ["x"]})
    with pytest.raises(DataError, match=r":2: duplicate id 'a'"):
        read_questions(write_lines(tmp_path / "d.jsonl", [row, row]))
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no records"):
        read_questions(tmp_path / "e.jsonl")
    with pytest.raises(DataError, match="file not found"):
        read_questions(tmp_path / "missing.jsonl")


def test_corpus_reader(tmp_path):
    p = write_lines(tmp_path / "c.jsonl", [
        json.dumps({"id": "0", "contents": "Title A\nText a."}),
        json.dumps({"id": "1", "contents": ""}),
    ])
    it = iter_corpus(p)
    first = next(it)
    assert (first.id, first.title, first.text) == ("0", "Title A", "Text a.")
    with pytest.raises(DataError, match=r":2: 'contents' must be a non-empty string"):
        next(it)


def test_iter_problems_lists_every_problem(tmp_path):
    p = write_lines(tmp_path / "d.jsonl", [b"{", json.dumps({"id": 1, "question": "", "golden_answers": ["x"]}).encode(),
                                           json.dumps({"id": 2, "question": "Q", "golden_answers": ["x"]}).encode()])
    problems = list(iter_problems(p, "questions"))
    assert [pr.split(": ")[0] for pr in problems] == [f"{p}:1", f"{p}:2"]


def test_validate_cli(tmp_path, repo_root, fixtures_dir):
    bad = write_lines(tmp_path / "bad.jsonl", [b"{", json.dumps({"id": "a", "question": "Q", "golden_answers": []}).encode()])
    corpus = write_lines(tmp_path / "corpus.jsonl", [json.dumps({"id": "0", "contents": "T\nx"}).encode()])
    run = lambda *files: subprocess.run([sys.executable, str(repo_root / "data" / "validate.py"), *map(str, files)],
                                        capture_output=True, text=True, timeout=60)
    r = run(bad)
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{bad}:1: not valid JSON (Expecting property name")
    assert lines[1] == f"{bad}:2: 'golden_answers' must be a non-empty list of strings"
    ok = run(fixtures_dir / "r1searcher" / "hotpotqa_20.jsonl", corpus)
    assert ok.returncode == 0 and ok.stdout == ""
    assert "ok (corpus)" in ok.stderr
    r = subprocess.run([sys.executable, str(repo_root / "data" / "validate.py"), "--kind", "bogus", "x"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice" in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: validate.py: ")


# ---- Hugging Face layouts, read from local files --------------------------------------------
def test_hf_hotpotqa_layout(tmp_path):
    row = {"id": "5a8b57f2", "question": "Which magazine was started first?", "answer": "Arthur's Magazine",
           "type": "comparison", "level": "medium",
           "supporting_facts": {"title": ["Arthur's Magazine", "First for Women", "Arthur's Magazine"], "sent_id": [0, 0, 1]},
           "context": {"title": ["Arthur's Magazine"], "sentences": [["It was a magazine."]]}}
    p = write_lines(tmp_path / "hp.jsonl", [json.dumps(row)])
    (q,) = load_hf_questions("hotpotqa", source=str(p))
    assert q.id == "5a8b57f2" and q.golden_answers == ["Arthur's Magazine"]
    assert q.metadata["type"] == "comparison"
    assert q.metadata["supporting_titles"] == ["Arthur's Magazine", "First for Women"]


def test_hf_musique_layout_with_aliases(tmp_path):
    row = {"id": "3hop1__1_2_3", "question": "Q?", "answer": "Ann", "answer_aliases": ["Annie"], "answerable": True,
           "question_decomposition": [{"id": 1, "question": "a?", "answer": "b", "paragraph_support_idx": 0},
                                      {"id": 2, "question": "c?", "answer": "d", "paragraph_support_idx": 1},
                                      {"id": 3, "question": "e?", "answer": "Ann", "paragraph_support_idx": 2}]}
    p = write_lines(tmp_path / "mq.jsonl", [json.dumps(row)])
    (q,) = load_hf_questions("musique", source=str(p))
    assert q.golden_answers == ["Ann", "Annie"] and q.metadata["hops"] == 3
    assert [d["answer"] for d in q.metadata["decomposition"]] == ["b", "d", "Ann"]


def test_hf_2wiki_layout_and_save_to_disk(tmp_path):
    import datasets

    rows = [{"_id": "w1", "question": "Who was born first?", "answer": "Bob", "type": "comparison",
             "supporting_facts": {"title": ["Bob", "Carl"], "sent_id": [0, 0]}, "evidences": [["Bob", "born", "1900"]]}]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "wiki"))
    (q,) = load_hf_questions("2wiki", source=str(tmp_path / "wiki"))
    assert q.id == "w1" and q.metadata["supporting_titles"] == ["Bob", "Carl"]


def test_hf_errors_are_one_line(tmp_path):
    with pytest.raises(DataError, match="unknown Hugging Face dataset"):
        load_hf_questions("nq")
    p = write_lines(tmp_path / "x.jsonl", [json.dumps({"foo": 1})])
    with pytest.raises(DataError, match=r"row 0: not a hotpotqa row"):
        load_hf_questions("hotpotqa", source=str(p))

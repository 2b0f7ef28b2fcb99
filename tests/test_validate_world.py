"""``data/validate.py WORLD/*.jsonl`` accepts every file a world build writes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r3rag.data.readers import detect_kind, iter_problems, record_kind
from r3rag.world import build_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    out = tmp_path_factory.mktemp("validate") / "world"
    build_world(out, seed=0, size="small")
    return out


def validate(repo_root, *args):
    return subprocess.run([sys.executable, str(repo_root / "data" / "validate.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=300)


def test_every_file_of_a_fresh_world_validates(world, repo_root):
    files = sorted(world.glob("*.jsonl"))
    assert {f.name for f in files} >= {"corpus.jsonl", "train.jsonl", "dev.jsonl", "test.jsonl", "facts.jsonl"}
    r = validate(repo_root, *files)
    assert r.returncode == 0, r.stdout[:2000]
    assert r.stdout == ""  # no problem lines at all
    kinds = dict(line.rsplit(": ok (", 1) for line in r.stderr.strip().splitlines())
    assert kinds[str(world / "facts.jsonl")].startswith("facts")
    assert kinds[str(world / "corpus.jsonl")].startswith("corpus")
    assert kinds[str(world / "dev.jsonl")].startswith("questions")


def test_a_bad_fact_is_reported_by_file_and_line(world, tmp_path, repo_root):
    lines = (world / "facts.jsonl").read_text(encoding="utf-8").splitlines()[:5]
    bad = json.loads(lines[2])
    bad["passage_id"] = ""
    lines[2] = json.dumps(bad)
    lines.append(lines[0])  # the same subject and relation twice
    path = tmp_path / "facts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(iter_problems(path, "facts")) == [
        f"{path}:3: 'passage_id' must be a non-empty string",
        f"{path}:6: duplicate id '{json.loads(lines[0])['subject']}:{json.loads(lines[0])['relation']}' (first on line 1)",
    ]
    r = validate(repo_root, path)
    assert r.returncode == 1 and r.stdout.count("\n") == 2


def test_unknown_records_are_one_problem_and_kind_can_be_forced(tmp_path, repo_root):
    path = tmp_path / "other.jsonl"
    path.write_text("".join(json.dumps({"foo": i}) + "\n" for i in range(50)))
    assert detect_kind(path) is None and record_kind({"subject": "e", "relation": "r"}) == "facts"
    r = validate(repo_root, path)
    assert r.returncode == 1 and r.stdout.strip().splitlines() == [
        f"{path}:1: not a question, corpus or facts record; pass --kind questions|corpus|facts"]
    forced = validate(repo_root, "--kind", "facts", path)
    assert forced.returncode == 1 and forced.stdout.count("\n") == 50


def test_an_empty_split_is_valid_but_named_empty(tmp_path, repo_root):
    path = tmp_path / "test.jsonl"
    path.write_text("")
    r = validate(repo_root, path)
    assert r.returncode == 0 and r.stderr.strip() == f"{path}: ok (questions, empty)"
    assert list(iter_problems(path, "questions")) == [f"{path}: no records (the file is empty)"]

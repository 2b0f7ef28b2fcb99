"""The embedded world: determinism, validation, no split leakage, the metadata contract, the CLI."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from r3rag.errors import R3RagError
from r3rag.world import FILES, QUESTION_TYPES, SIZES, build_world, validate_world
from r3rag.world.generator import date_aliases
from r3rag.world.names import acronym, near_duplicate
from r3rag.world.questions import decide
from r3rag.world.schema import RELATIONS
from r3rag.world.validator import sortable

ROOT = Path(__file__).resolve().parents[1]
SPLITS = ("train", "dev", "test")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("world-small")
    build_world(out, seed=0, size="small")
    return out


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def copy_world(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# --- hand-worked pieces ---------------------------------------------------------------------


def test_date_aliases_keep_the_day_and_never_offer_the_bare_year():
    assert date_aliases(1874, 3, 12) == ["12 March 1874", "March 12, 1874"]


def test_sortable_reads_dates_and_years():
    assert sortable("12 March 1874") == (1874, 3, 12)
    assert sortable("3 December 1874") > sortable("12 March 1874")
    assert sortable("1901") == (1901,)


def test_near_duplicate_changes_only_the_final_vowel():
    rng = random.Random(1)
    for _ in range(20):
        other = near_duplicate("Varnel Oskaro", rng)
        assert other != "Varnel Oskaro"
        assert other.startswith("Varnel Oskar") and len(other) == len("Varnel Oskaro")


def test_acronym_only_for_three_words_or_more():
    assert acronym("Quorvin Shipping Company") == "QSC"
    assert acronym("Quorvin Bank") is None


def test_decide_recomputes_comparisons_by_hand():
    steps = [{"answer": "12 March 1874"}, {"answer": "1 May 1860"}]
    keys = [sortable(s["answer"]) for s in steps]
    cmp = {"steps": [0, 1], "options": ["Ana", "Bo"]}
    assert decide({**cmp, "op": "earlier"}, steps, keys) == "Bo"  # 1860 is earlier
    assert decide({**cmp, "op": "later"}, steps, keys) == "Ana"
    assert decide({**cmp, "op": "before"}, steps, keys) == "no"  # 1874 is not before 1860
    same = [{"answer": "Tessaly"}, {"answer": "Tessaly"}]
    assert decide({**cmp, "op": "same"}, same, [("Tessaly",), ("Tessaly",)]) == "yes"


def test_every_relation_template_states_its_object():
    for rel in RELATIONS.values():
        for template in rel.literal + rel.paraphrase + rel.inverse:
            assert "{y}" in template, (rel.name, template)
        for template in rel.ask:
            assert "{x}" in template and "{y}" not in template


# --- the built world ------------------------------------------------------------------------


def test_build_is_byte_identical_for_a_seed(tmp_path):
    a = build_world(tmp_path / "a", seed=7, size="small")
    b = build_world(tmp_path / "b", seed=7, size="small")
    assert a == b
    for name in (*FILES, "manifest.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    c = build_world(tmp_path / "c", seed=8, size="small")
    assert c["files"]["corpus.jsonl"]["sha256"] != a["files"]["corpus.jsonl"]["sha256"]


def test_small_world_has_its_size_and_manifest(small):
    manifest = json.loads((small / "manifest.json").read_text())
    counts = manifest["counts"]
    assert 1600 <= counts["passages"] <= 2600
    assert 800 <= sum(counts["questions"].values()) <= 1300
    assert manifest["seed"] == 0 and manifest["size"] == "small"
    assert len(read_jsonl(small / "corpus.jsonl")) == counts["passages"]
    for split in SPLITS:
        assert len(read_jsonl(small / f"{split}.jsonl")) == counts["questions"][split]
        assert sum(manifest["per_type"][split].values()) == counts["questions"][split]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_validator_passes_for_several_seeds(tmp_path, seed, small):
    world = small if seed == 0 else tmp_path
    if seed:
        build_world(world, seed=seed, size="small")
    assert validate_world(world) == []


def test_every_type_and_hop_count_is_present(small):
    manifest = json.loads((small / "manifest.json").read_text())
    for qtype in QUESTION_TYPES:
        assert sum(manifest["per_type"][s][qtype] for s in SPLITS) > 0, qtype
    for split in SPLITS:
        for hops in ("1", "2", "3", "4"):
            assert manifest["per_hops"][split][hops] > 0, (split, hops)


def test_question_and_passage_contract(small):
    passages = {p["id"]: p["contents"] for p in read_jsonl(small / "corpus.jsonl")}
    assert all(pid.startswith("w") and len(pid) == 8 for pid in passages)
    for split in SPLITS:
        for q in read_jsonl(small / f"{split}.jsonl"):
            assert q["id"].startswith(f"{split}-") and len(q["id"]) == len(split) + 7
            meta = q["metadata"]
            assert meta["hops"] == len(meta["decomposition"])
            assert meta["type"] in QUESTION_TYPES
            for step in meta["decomposition"]:
                assert set(step) >= {"question", "answer", "supporting_ids"}
                assert all(pid in passages for pid in step["supporting_ids"])
            if meta["type"] in ("bridge", "compositional", "inference"):
                # later sub-questions have the earlier answers filled in
                steps = meta["decomposition"]
                for prev, nxt in zip(steps, steps[1:]):
                    assert prev["answer"] in nxt["question"]
                assert q["golden_answers"][0] == steps[-1]["answer"]
            if meta["answer_type"] == "date":
                year = q["golden_answers"][0].rsplit(" ", 1)[1]
                assert year not in q["golden_answers"]
                assert len(q["golden_answers"]) == 2
            if meta["answer_type"] == "yes/no":
                assert q["golden_answers"] in (["yes"], ["no"])


def test_yes_no_answers_are_balanced(small):
    answers = [q["golden_answers"][0] for s in SPLITS for q in read_jsonl(small / f"{s}.jsonl")
               if q["metadata"]["type"] == "yesno"]
    assert 0.3 <= answers.count("yes") / len(answers) <= 0.7


def test_surname_alias_only_when_unique_in_the_world(small):
    people = {}
    for f in read_jsonl(small / "facts.jsonl"):
        if f["relation"] == "birth_date":
            people[f["subject"]] = f["subject_name"]
    surnames: dict[str, int] = {}
    for name in people.values():
        surnames[name.rsplit(" ", 1)[1]] = surnames.get(name.rsplit(" ", 1)[1], 0) + 1
    seen_alias = False
    for split in SPLITS:
        for q in read_jsonl(small / f"{split}.jsonl"):
            if q["metadata"]["answer_type"] != "person":
                continue
            name, *aliases = q["golden_answers"]
            for alias in aliases:
                assert alias == name.rsplit(" ", 1)[1] and surnames[alias] == 1
                seen_alias = True
    assert seen_alias


def test_no_entity_leaks_across_splits(small):
    owner: dict[str, str] = {}
    names: dict[str, set[str]] = {s: set() for s in SPLITS}
    for split in SPLITS:
        for q in read_jsonl(small / f"{split}.jsonl"):
            for ent in q["metadata"]["entities"]:
                assert owner.setdefault(ent, split) == split, f"{ent} in {owner[ent]} and {split}"
            if q["metadata"]["answer_type"] in ("person", "place", "organisation", "work"):
                names[split].add(q["golden_answers"][0])
    assert not names["train"] & names["dev"]
    assert not names["train"] & names["test"]
    assert not names["dev"] & names["test"]


def test_a_near_namesake_shares_the_query_tokens(small):
    """The hard distractors exist: a given-name page lists two people with almost the same name."""
    lists = [p["contents"] for p in read_jsonl(small / "corpus.jsonl") if "(given name)" in p["contents"].split("\n")[0]]
    assert lists
    text = lists[0].split("\n", 1)[1]
    given = lists[0].split(" (given name)")[0]
    assert text.count(given) >= 3


# --- the validator catches corruption -------------------------------------------------------


def test_validator_catches_a_removed_supporting_passage(small, tmp_path):
    world = copy_world(small, tmp_path / "w")
    q = read_jsonl(world / "dev.jsonl")[0]
    gone = q["metadata"]["decomposition"][0]["supporting_ids"][0]
    rows = [p for p in read_jsonl(world / "corpus.jsonl") if p["id"] != gone]
    write_jsonl(world / "corpus.jsonl", rows)
    problems = validate_world(world)
    assert any("corpus.jsonl" in p and "sha256" in p for p in problems)
    assert any(gone in p and "dev.jsonl:1:" in p for p in problems)


def test_validator_catches_an_answer_missing_from_its_passage(small, tmp_path):
    world = copy_world(small, tmp_path / "w")
    q = read_jsonl(world / "dev.jsonl")[0]
    step = q["metadata"]["decomposition"][0]
    rows = read_jsonl(world / "corpus.jsonl")
    for p in rows:
        if p["id"] == step["supporting_ids"][0]:
            title, text = p["contents"].split("\n", 1)
            p["contents"] = title + "\n" + text.replace(step["answer"], "someone")
    write_jsonl(world / "corpus.jsonl", rows)
    assert any("does not appear in passage" in p and "dev.jsonl:1:" in p for p in validate_world(world))


def test_validator_catches_changed_answers(small, tmp_path):
    world = copy_world(small, tmp_path / "w")
    rows = read_jsonl(world / "test.jsonl")
    chain = next(i for i, q in enumerate(rows) if q["metadata"]["type"] == "bridge")
    comp = next(i for i, q in enumerate(rows) if q["metadata"]["type"] == "comparison")
    rows[chain]["golden_answers"][0] = "Nobody Atall"
    opts = rows[comp]["metadata"]["compare"]["options"]
    rows[comp]["golden_answers"][0] = opts[1] if rows[comp]["golden_answers"][0] == opts[0] else opts[0]
    step_row = next(i for i, q in enumerate(rows) if i not in (chain, comp))
    rows[step_row]["metadata"]["decomposition"][0]["answer"] = "1066"
    write_jsonl(world / "test.jsonl", rows)
    problems = validate_world(world)
    assert any(f"test.jsonl:{chain + 1}:" in p and "last step" in p for p in problems)
    assert any(f"test.jsonl:{comp + 1}:" in p and "sub-answers give" in p for p in problems)
    assert any(f"test.jsonl:{step_row + 1}:" in p and "relation table says" in p for p in problems)


def test_validator_catches_leakage_between_splits(small, tmp_path):
    world = copy_world(small, tmp_path / "w")
    train = read_jsonl(world / "train.jsonl")
    test = read_jsonl(world / "test.jsonl")
    leaked = dict(train[0], id=f"test-{len(test):06d}")
    write_jsonl(world / "test.jsonl", test + [leaked])
    assert any("leakage" in p and f"test.jsonl:{len(test) + 1}:" in p for p in validate_world(world))


def test_validator_reports_bad_json_with_file_and_line(small, tmp_path):
    world = copy_world(small, tmp_path / "w")
    with (world / "dev.jsonl").open("a") as f:
        f.write("{not json\n")
    n = len((world / "dev.jsonl").read_text().splitlines())
    assert any(p.startswith(f"{world / 'dev.jsonl'}:{n}: not valid JSON") for p in validate_world(world))


def test_unknown_size_is_a_user_error(tmp_path):
    with pytest.raises(R3RagError, match="unknown world size"):
        build_world(tmp_path, size="huge")


# --- command line ---------------------------------------------------------------------------


def run_script(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, env=full_env)


def test_cli_help_and_bad_flag():
    ok = run_script("data/build_world.py", "--help")
    assert ok.returncode == 0 and "--size" in ok.stdout and "--seed" in ok.stdout
    bad = run_script("data/build_world.py", "--out", "x", "--size", "huge")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "huge" in lines[0]


def test_cli_builds_and_validates(tmp_path):
    # another process with another string-hash seed must write the same bytes
    out = run_script("data/build_world.py", "--out", str(tmp_path / "w"), "--size", "tiny", "--seed", "3", "--quiet",
                     env={"PYTHONHASHSEED": "12345"})
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["valid"] is True and summary["passages"] > 300
    here = build_world(tmp_path / "here", seed=3, size="tiny")
    assert json.loads((tmp_path / "w" / "manifest.json").read_text()) == here
    check = run_script("data/validate_world.py", str(tmp_path / "w"))
    assert check.returncode == 0 and check.stdout == ""
    (tmp_path / "w" / "facts.jsonl").write_text("")
    broken = run_script("data/validate_world.py", str(tmp_path / "w"))
    assert broken.returncode == 1 and "no fact" in broken.stdout


# --- larger sizes ---------------------------------------------------------------------------


@pytest.mark.slow
def test_medium_builds_and_validates(tmp_path):
    manifest = build_world(tmp_path, seed=0, size="medium")
    assert 40_000 <= manifest["counts"]["passages"] <= 60_000
    assert validate_world(tmp_path) == []


@pytest.mark.slow
def test_large_streams_in_bounded_memory(tmp_path):
    """The large size's path, scaled down: memory grows only by the names, never by passages."""
    assert SIZES["large"].clusters * 50 >= 900_000  # the full size is about 1M passages
    peaks, corpus_bytes = [], []
    for n in (20, 80):
        tracemalloc.start()
        manifest = build_world(tmp_path / str(n), seed=0, size="large", clusters=n)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        corpus_bytes.append(manifest["files"]["corpus.jsonl"]["bytes"])
        expected = int(SIZES["large"].questions_per_cluster * n)
        assert sum(manifest["counts"]["questions"].values()) == pytest.approx(expected, abs=2)
        assert validate_world(tmp_path / str(n)) == []
    # four times the clusters: the extra memory is a few KB of names per cluster,
    # far less than the extra text written
    assert peaks[1] - peaks[0] < 60 * 8_000
    assert peaks[1] - peaks[0] < 0.5 * (corpus_bytes[1] - corpus_bytes[0])


@pytest.mark.slow
def test_bm25_finds_most_but_not_all_gold_passages(small):
    from r3rag.world.difficulty import subquestion_hits

    result = subquestion_hits(small, k=5)
    assert 0.6 <= result["subq_hit"] <= 0.92
    assert result["all_hit"] < result["subq_hit"]
    assert result["all_hit_by_hops"]["4"] < result["all_hit_by_hops"]["1"]

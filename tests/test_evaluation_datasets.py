"""Dataset resolution (named subsets, hub converters on local copies, the world, paths) and the judge."""

from __future__ import annotations

import json

import pytest

from r3rag.config import load_config
from r3rag.errors import DataError
from r3rag.evaluation.config import DatasetConfig, EvaluationConfig
from r3rag.evaluation.datasets import ensure_world, resolve_dataset
from r3rag.evaluation.runner import run_evaluation
from r3rag.testing.standin_judge import StandinJudge


def test_named_subsets_come_from_the_data_dir(fixtures_dir, tmp_path):
    (tmp_path / "bamboogle.jsonl").write_bytes((fixtures_dir / "r1searcher" / "bamboogle_20.jsonl").read_bytes())
    d = resolve_dataset(DatasetConfig(name="bamboogle", data_dir=str(tmp_path), limit=20))
    assert d.name == "bamboogle" and len(d.questions) == 20 and d.source.endswith("bamboogle.jsonl")
    # the published subsets shipped in the repository (500 questions; first 3 kept)
    d = resolve_dataset(DatasetConfig(name="hotpotqa", limit=3))
    assert len(d.questions) == 3 and d.source.endswith("hotpotqa_500.jsonl") and d.questions[0].golden_answers


def test_hub_converter_on_a_local_copy(tmp_path):
    rows = [{"id": f"5a{i}", "question": f"Q{i}?", "answer": f"A{i}", "type": "bridge" if i % 2 else "comparison",
             "level": "hard", "supporting_facts": {"title": ["T1", "T2"], "sent_id": [0, 1]}} for i in range(3)]
    path = tmp_path / "hotpot_dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = resolve_dataset(DatasetConfig(name="hotpotqa", source=str(path), limit=2))
    assert [q.id for q in d.questions] == ["5a0", "5a1"]
    assert d.questions[1].golden_answers == ["A1"] and d.questions[1].metadata["type"] == "bridge"
    with pytest.raises(DataError, match="no Hugging Face converter"):
        resolve_dataset(DatasetConfig(name="bamboogle", source=str(path)))


def test_world_is_built_once_and_checked(tmp_path):
    d = resolve_dataset(DatasetConfig(name="world", world_dir=str(tmp_path / "w"), limit=5))
    assert d.world_dir == tmp_path / "w" and len(d.questions) == 5 and d.questions[0].id.startswith("dev-")
    stamp = (tmp_path / "w" / "dev.jsonl").stat().st_mtime_ns
    ensure_world(tmp_path / "w")  # reused, not rebuilt
    assert (tmp_path / "w" / "dev.jsonl").stat().st_mtime_ns == stamp
    with pytest.raises(DataError, match="holds the world with seed 0"):
        ensure_world(tmp_path / "w", seed=1)
    with pytest.raises(DataError, match="world split 'validation'"):
        resolve_dataset(DatasetConfig(name="world", world_dir=str(tmp_path / "w"), split="validation"))
    with pytest.raises(DataError, match="not a file and not one of"):
        resolve_dataset(DatasetConfig(name=str(tmp_path / "nope.jsonl")))


def test_judge_accuracy_with_a_standin_judge(tmp_path):
    world = ensure_world(tmp_path / "w")
    with StandinJudge(mode="correct") as judge:
        cfg = load_config(EvaluationConfig, None, [
            f"dataset.world_dir={world}", "dataset.limit=6", "method.name=oracle", "run.progress=false",
            "run.judge=true", f"judge.base_url={judge.base_url}", "judge.cache_path=null", "run.bootstrap=50"])
        res = run_evaluation(cfg, tmp_path / "run").results
    # the stand-in judges by rule, so for the oracle (gold or "unknown") it agrees with EM
    assert res["metrics"]["judge_acc"] == res["metrics"]["em"]
    assert res["metrics"]["rule_or_judge_acc"] == res["metrics"]["cover_em"]
    assert "judge_acc" in res["ci95"] and "judge (ACC_L)" in (tmp_path / "run" / "report.md").read_text()

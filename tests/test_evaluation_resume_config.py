"""An evaluation folder resumes only a run with the same settings.

The oracle (no model) on the embedded world keeps these fast: a changed ``--set rollout.*`` is
refused with one line naming it, a larger ``dataset.limit`` extends a run (the quickstart's
``--limit 0``), a smaller one is refused, settings that only say where or how fast resume, and the
key is on disk before the first prediction, so a killed run is protected too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r3rag.config import load_config
from r3rag.errors import ConfigError
from r3rag.evaluation import runner as runner_mod
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.datasets import ensure_world
from r3rag.evaluation.predictions import load_rows
from r3rag.evaluation.run_key import run_key
from r3rag.evaluation.runner import run_evaluation


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return ensure_world(tmp_path_factory.mktemp("resume") / "world", seed=0, size="small")


def cfg(world, *overrides):
    base = [f"dataset.world_dir={world}", "method.name=oracle", "run.progress=false", "run.bootstrap=50"]
    return load_config(EvaluationConfig, None, base + list(overrides))


def test_changed_rollout_setting_is_refused_naming_it(world, tmp_path):
    run_evaluation(cfg(world, "dataset.limit=4"), tmp_path / "run")
    with pytest.raises(ConfigError) as err:
        run_evaluation(cfg(world, "dataset.limit=4", "rollout.docs_per_step=2"), tmp_path / "run")
    msg = str(err.value)
    assert "holds a run with rollout.docs_per_step=5, not 2; use another --out" in msg and "\n" not in msg
    with pytest.raises(ConfigError, match=r"method\.oracle_format='r3rag_steps', not 'r1searcher_tags'"):
        run_evaluation(cfg(world, "dataset.limit=4", "method.oracle_format=r1searcher_tags"), tmp_path / "run")
    with pytest.raises(ConfigError, match=r"rollout\.max_steps=5, not 3 \(and 1 more: rollout\.temperature\)"):
        run_evaluation(cfg(world, "dataset.limit=4", "rollout.max_steps=3", "rollout.temperature=0.5"), tmp_path / "run")
    # where and how fast are not what: these resume without redoing anything
    again = run_evaluation(cfg(world, "dataset.limit=4", "run.batch_size=2", "retriever.bm25_backend=auto",
                               "run.bootstrap=10", "model.device=meta"), tmp_path / "run")
    assert (again.new, again.skipped) == (0, 4)


def test_a_larger_limit_extends_a_run_and_a_smaller_one_is_refused(world, tmp_path):
    first = run_evaluation(cfg(world, "dataset.limit=3"), tmp_path / "run")
    assert (first.new, first.skipped) == (3, 0)
    grown = run_evaluation(cfg(world, "dataset.limit=7"), tmp_path / "run")
    assert (grown.new, grown.skipped) == (4, 3)
    rows = load_rows(tmp_path / "run" / "predictions.jsonl")
    assert sorted(r["index"] for r in rows) == list(range(7))
    straight = run_evaluation(cfg(world, "dataset.limit=7"), tmp_path / "straight")
    assert (tmp_path / "run" / "results.json").read_text() == (tmp_path / "straight" / "results.json").read_text()
    assert straight.new == 7
    with pytest.raises(ConfigError, match=r"is not among this run's questions \(dataset\.limit=2, shard\); a run is extended"):
        run_evaluation(cfg(world, "dataset.limit=2"), tmp_path / "run")


def test_skip_leaves_out_the_first_questions_and_keeps_their_positions(world, tmp_path):
    """``dataset.skip=3`` evaluates questions 3.. of the split, each under its position in the file;
    with a limit it takes the next N; shards of a skipped run merge to the unsharded run; and a
    run of another skip is another run (refused), while skip 0 stays out of the key."""
    from r3rag.evaluation.merge import merge_runs

    every = load_rows(run_evaluation(cfg(world, "dataset.limit=7"), tmp_path / "all").out_dir / "predictions.jsonl")
    skipped = run_evaluation(cfg(world, "dataset.skip=3", "dataset.limit=4"), tmp_path / "skip")
    assert (skipped.new, skipped.results["n"]) == (4, 4)
    rows = load_rows(tmp_path / "skip" / "predictions.jsonl")
    assert [r["index"] for r in rows] == [3, 4, 5, 6]
    assert [r["id"] for r in rows] == [r["id"] for r in every[3:7]]  # the same questions as positions 3..6 of the whole
    assert [r["prediction"] for r in rows] == [r["prediction"] for r in every[3:7]]
    for i in (0, 1):
        run_evaluation(cfg(world, "dataset.skip=3", "dataset.limit=4", f"run.shard={i}/2"), tmp_path / f"s{i}")
    merged = merge_runs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "merged")
    assert merged == skipped.results
    grown = run_evaluation(cfg(world, "dataset.skip=3", "dataset.limit=6"), tmp_path / "skip")  # a larger limit extends
    assert (grown.new, grown.skipped) == (2, 4)
    with pytest.raises(ConfigError, match=r"holds a run with dataset\.skip=3, not 2"):
        run_evaluation(cfg(world, "dataset.skip=2", "dataset.limit=4"), tmp_path / "skip")
    with pytest.raises(ConfigError, match=r"holds a run with dataset\.skip=None, not 3"):
        run_evaluation(cfg(world, "dataset.skip=3", "dataset.limit=4"), tmp_path / "all")
    assert "dataset.skip" not in run_key(cfg(world)) and run_key(cfg(world, "dataset.skip=1"))["dataset.skip"] == 1


def test_a_skip_past_the_end_is_a_clear_error(world, tmp_path):
    from r3rag.errors import DataError

    with pytest.raises(DataError, match=r"dataset\.skip=100000: .*dev\.jsonl has only \d+ questions"):
        run_evaluation(cfg(world, "dataset.skip=100000"), tmp_path / "run")


def test_rows_of_another_dataset_version_are_refused(world, tmp_path):
    run_evaluation(cfg(world, "dataset.limit=2"), tmp_path / "run")
    path = tmp_path / "run" / "predictions.jsonl"
    rows = load_rows(path)
    rows[1]["golden_answers"] = ["someone else"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="predicted for another version of the dataset"):
        run_evaluation(cfg(world, "dataset.limit=2"), tmp_path / "run")


def test_the_key_is_on_disk_before_the_first_prediction(world, tmp_path, monkeypatch):
    """A run killed after some predictions (here: failing while it computes the results) still
    refuses a rerun with other settings."""

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner_mod, "build_results", killed)
    with pytest.raises(KeyboardInterrupt):
        run_evaluation(cfg(world, "dataset.limit=3"), tmp_path / "run")
    monkeypatch.undo()
    assert len(load_rows(tmp_path / "run" / "predictions.jsonl")) == 3
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config_key"] == run_key(cfg(world, "dataset.limit=3"))
    with pytest.raises(ConfigError, match=r"rollout\.top_p=1\.0, not 0\.5"):
        run_evaluation(cfg(world, "dataset.limit=3", "rollout.top_p=0.5"), tmp_path / "run")
    resumed = run_evaluation(cfg(world, "dataset.limit=3"), tmp_path / "run")
    assert (resumed.new, resumed.skipped) == (0, 3)


def test_shards_of_different_settings_do_not_merge(world, tmp_path):
    from r3rag.errors import DataError
    from r3rag.evaluation.merge import merge_runs

    run_evaluation(cfg(world, "dataset.limit=4", "run.shard=0/2"), tmp_path / "s0")
    run_evaluation(cfg(world, "dataset.limit=4", "run.shard=1/2", "rollout.docs_per_step=3"), tmp_path / "s1")
    with pytest.raises(DataError, match=r"ran with other settings .*rollout\.docs_per_step=5, not 3"):
        merge_runs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "merged")


def test_cli_refusal_is_one_line(world, tmp_path, repo_root):
    run_evaluation(cfg(world, "dataset.limit=2"), tmp_path / "run")
    sets = [f"dataset.world_dir={world}", "dataset.limit=2", "run.bootstrap=50", "rollout.temperature=0.7"]
    r = subprocess.run([sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "run", "--method", "oracle",
                        "--out", str(tmp_path / "run"), "--no-progress", *[a for s in sets for a in ("--set", s)]],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'run'} holds a run with rollout.temperature=0.0, not 0.7; use another --out"]


def test_every_excluded_setting_exists():
    """A renamed config field must not leave a stale name in the exclusions (nor slip into the key)."""
    from r3rag.evaluation.run_key import NOT_IN_KEY, _flatten

    flat = _flatten(EvaluationConfig().model_dump(mode="json"))
    assert sorted(k for k in NOT_IN_KEY if k not in flat) == []
    key = run_key(EvaluationConfig())
    assert {"rollout.temperature", "model.path", "retriever.index_dir", "dataset.name", "method.name"} <= set(key)
    assert not set(key) & NOT_IN_KEY


def test_the_skip_flag_is_the_dataset_skip_shorthand(world, tmp_path, repo_root):
    r = subprocess.run([sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "run", "--method", "oracle", "--skip", "3",
                        "--limit", "2", "--out", str(tmp_path / "run"), "--no-progress", "--set", f"dataset.world_dir={world}",
                        "--set", "run.bootstrap=50"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert [row["index"] for row in load_rows(tmp_path / "run" / "predictions.jsonl")] == [3, 4]
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config_key"]["dataset.skip"] == 3

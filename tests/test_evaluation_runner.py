"""The evaluation runner on the embedded world: oracle metrics, resume, shards and merge, bad data."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from r3rag.config import load_config
from r3rag.data.readers import read_questions
from r3rag.errors import ConfigError, DataError
from r3rag.evaluation import methods as methods_mod
from r3rag.evaluation import runner as runner_mod
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.datasets import ensure_world
from r3rag.evaluation.merge import merge_runs
from r3rag.evaluation.predictions import load_rows
from r3rag.evaluation.runner import run_evaluation
from r3rag.rollout.trajectory import Trajectory

N = 10


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return ensure_world(tmp_path_factory.mktemp("eval") / "world", seed=0, size="small")


def config(world, *overrides):
    base = [f"dataset.world_dir={world}", "run.progress=false", "run.bootstrap=200", f"dataset.limit={N}",
            "run.batch_size=4"]
    return load_config(EvaluationConfig, None, base + list(overrides))


@pytest.fixture(scope="module")
def oracle_run(world, tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle")
    return run_evaluation(config(world, "method.name=oracle"), out)


def test_oracle_metrics_are_what_its_trajectories_imply(world, oracle_run):
    questions = {q.id: q for q in read_questions(world / "dev.jsonl", limit=N)}
    rows = sorted(load_rows(oracle_run.out_dir / "predictions.jsonl"), key=lambda r: r["index"])
    assert [r["id"] for r in rows] == list(questions)
    correct, retrievals = [], []
    for r in rows:
        q, t = questions[r["id"]], Trajectory.from_dict(r["trajectory"])
        decomposition = q.metadata["decomposition"]
        # the oracle answers gold iff each sub-answer was in the documents retrieved so far
        found, shown = [], ""
        for step, sub in zip(t.steps, decomposition):
            assert step.query == sub["question"]
            shown += " ".join(d.contents for d in step.documents).lower()
            found.append(sub["answer"].lower() in shown)
            if not found[-1]:
                break
        gold_answered = t.answer == q.golden_answers[0]
        assert gold_answered == (all(found) and len(found) == len(decomposition))
        assert gold_answered or t.answer == "unknown"
        correct.append(gold_answered)
        retrievals.append(len(t.queries))
    res = oracle_run.results
    assert 0 < sum(correct) < N  # a slice where the oracle both succeeds and gives up
    for m in ("em", "cover_em", "acc", "f1"):
        assert res["metrics"][m] == round(100 * sum(correct) / N, 1)
    assert res["avg_retrievals"] == round(sum(retrievals) / N, 3)
    assert res["stop_reasons"] == {"answered": 100.0}
    assert sum(g["n"] for g in res["by_hops"].values()) == N and res["by_type"]
    curve = res["accuracy_by_steps"]["em"]
    assert all(a <= b for a, b in zip(curve, curve[1:])) and curve[-1] == res["metrics"]["em"]
    # cut after k steps: correct answers given within the first k steps, by hand
    for k, value in zip(res["accuracy_by_steps"]["k"], curve):
        by_hand = sum(ok and len(Trajectory.from_dict(r["trajectory"]).steps) <= k for ok, r in zip(correct, rows))
        assert value == round(100 * by_hand / N, 1)
    lo, hi = res["ci95"]["em"]
    assert lo <= res["metrics"]["em"] <= hi
    saved = json.loads((oracle_run.out_dir / "results.json").read_text())
    assert saved == res and (oracle_run.out_dir / "report.md").is_file()


def test_rerun_skips_finished_ids(world, oracle_run):
    before = (oracle_run.out_dir / "predictions.jsonl").read_text()
    again = run_evaluation(config(world, "method.name=oracle"), oracle_run.out_dir)
    assert (again.new, again.skipped) == (0, N)
    assert (oracle_run.out_dir / "predictions.jsonl").read_text() == before
    assert again.results == oracle_run.results


def test_two_shards_merged_equal_one_unsharded_run(world, oracle_run, tmp_path):
    for i in (0, 1):
        part = run_evaluation(config(world, "method.name=oracle", f"run.shard={i}/2"), tmp_path / f"s{i}")
        assert part.new == N // 2
    with pytest.raises(DataError, match="5 of 10 questions have no prediction"):
        merge_runs([tmp_path / "s0"], tmp_path / "bad")
    merge_runs([tmp_path / "s1", tmp_path / "s0"], tmp_path / "merged")
    assert (tmp_path / "merged" / "results.json").read_text() == (oracle_run.out_dir / "results.json").read_text()
    with pytest.raises(DataError, match="is also in"):
        merge_runs([tmp_path / "s0", tmp_path / "s0"], tmp_path / "dup")


def test_out_folder_of_another_run_is_refused(world, oracle_run):
    with pytest.raises(ConfigError, match="holds a run with method.name='oracle', not 'direct'"):
        run_evaluation(config(world, "method.name=direct"), oracle_run.out_dir)


def test_bad_dataset_line_fails_before_any_model_is_loaded(tmp_path, monkeypatch, repo_root):
    bad = tmp_path / "bad.jsonl"
    lines = [{"id": "a", "question": "Q1?", "golden_answers": ["x"]}, {"id": "b", "question": "Q2?", "golden_answers": ["y"]},
             {"id": "c", "question": "", "golden_answers": ["z"]}]
    bad.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def boom(*a, **k):
        raise AssertionError("a model was loaded before the dataset was validated")

    monkeypatch.setattr(methods_mod, "load_backend", boom)
    monkeypatch.setattr(runner_mod, "build_method", boom)
    cfg = load_config(EvaluationConfig, None, [f"dataset.name={bad}", "method.name=rag", "run.progress=false"])
    with pytest.raises(DataError, match=r"bad\.jsonl:3: 'question' must be a non-empty string"):
        run_evaluation(cfg, tmp_path / "out")
    r = subprocess.run([sys.executable, str(repo_root / "benchmark" / "evaluate.py"), "run", "--dataset", str(bad),
                        "--method", "r3rag_steps", "--model", str(tmp_path / "no-such-model"), "--out", str(tmp_path / "o2")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "bad.jsonl:3:" in r.stderr, r.stderr


def test_unknown_method_and_oracle_without_decomposition(tmp_path, fixtures_dir):
    cfg = load_config(EvaluationConfig, None, ["method.name=magic", "run.progress=false"])
    with pytest.raises(ConfigError, match="unknown method 'magic'"):
        run_evaluation(cfg, tmp_path / "a")
    path = fixtures_dir / "r1searcher" / "bamboogle_20.jsonl"
    cfg = load_config(EvaluationConfig, None, [f"dataset.name={path}", "method.name=oracle", "run.progress=false"])
    with pytest.raises(ConfigError, match="oracle needs questions with a gold decomposition"):
        run_evaluation(cfg, tmp_path / "b")
    with pytest.raises(ConfigError, match="shard"):
        load_config(EvaluationConfig, None, ["run.shard=2/2"])


def test_vllm_engine_arguments_reach_the_engine_and_hf_settings_do_not(monkeypatch):
    """``model.engine_kwargs`` and ``model.dtype`` go to the vLLM backend's constructor (where they
    become ``vllm.LLM(...)`` arguments); the HF backend's own settings are not passed to vLLM."""
    from r3rag.evaluation import components
    from r3rag.rollout.backends import registry

    seen: dict = {}
    monkeypatch.setitem(registry.BACKENDS, "vllm", lambda **kw: seen.update(kw) or "engine")
    cfg = EvaluationConfig.model_validate({"model": {"backend": "vllm", "path": "/ckpt", "dtype": "bfloat16",
                                                     "engine_kwargs": {"max_model_len": 4096, "enforce_eager": True}}})
    assert components.load_backend(cfg.model) == "engine"
    assert seen == {"model": "/ckpt", "dtype": "bfloat16", "max_model_len": 4096, "enforce_eager": True}
    # the same keys from the command line, as benchmark/perf/eval_backends.py passes them
    cfg = load_config(EvaluationConfig, None, ["model.backend=vllm", "model.path=/ckpt",
                                                "model.engine_kwargs={max_model_len: 2048, seed: 0}"])
    seen.clear()
    components.load_backend(cfg.model)
    assert seen == {"model": "/ckpt", "dtype": "float32", "max_model_len": 2048, "seed": 0}

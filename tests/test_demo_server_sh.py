"""startup/server.sh: starts the retrieval service (and a model server) with logs and PID files, waits for health,
binds 127.0.0.1, refuses a second start, and ``--stop`` leaves no process behind (checked by PID)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from demo_helpers import alive, free_port, group_members, listening_addresses, server_sh


def test_help_and_bad_options():
    ok = server_sh("--help", timeout=30)
    assert ok.returncode == 0 and "--stop" in ok.stdout and "--vllm-model" in ok.stdout
    bad = server_sh("--no-such-flag", timeout=30)
    assert bad.returncode == 2 and bad.stderr.strip() == "server.sh: error: unknown option '--no-such-flag' (see --help)"
    bad = server_sh("--retriever-port", "eighty", timeout=30)
    assert bad.returncode == 2 and "expected a number, got 'eighty'" in bad.stderr
    bad = server_sh("--world-size", "huge", timeout=30)
    assert bad.returncode == 2 and "--world-size must be" in bad.stderr


def test_stop_with_nothing_started(tmp_path):
    out = server_sh("--stop", "--run-dir", str(tmp_path), timeout=30)
    assert out.returncode == 0 and "nothing to stop" in out.stdout
    out = server_sh("--status", "--run-dir", str(tmp_path / "never"), timeout=30)
    assert out.returncode == 0 and "nothing started" in out.stdout and not (tmp_path / "never").exists()


@pytest.mark.slow
def test_failed_start_is_reported_and_cleaned_up(tmp_path):
    """An index directory without a manifest: one clear error line, nothing left running."""
    (tmp_path / "index").mkdir()
    index = str(tmp_path / "index")
    out = server_sh("--run-dir", str(tmp_path / "run"), "--index", index, "--retriever-port", str(free_port()), timeout=60)
    assert out.returncode == 2 and "no manifest.json" in out.stderr
    assert not list((tmp_path / "run" / "pids").glob("*.pid"))


FAKE_VLLM = '''#!{python}
"""Stands in for `vllm serve MODEL --host H --port P --served-model-name N`: an OpenAI-compatible
server (r3rag.testing.openai_standin) over the HF backend with the model folder given."""
import argparse, uvicorn
from r3rag.rollout.backends.hf import HFBackend
from r3rag.testing.openai_standin import create_openai_app
p = argparse.ArgumentParser()
p.add_argument("cmd"); p.add_argument("model"); p.add_argument("--host"); p.add_argument("--port", type=int)
p.add_argument("--served-model-name")
a = p.parse_args()
assert a.cmd == "serve"
app = create_openai_app(HFBackend.from_pretrained(a.model), a.served_model_name)
uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
'''


@pytest.mark.slow
def test_start_serve_a_question_and_stop_leaves_no_process(tmp_path):
    """Both services: the retrieval service over the tiny world and a model server (a stand-in for
    `vllm serve`, chosen with VLLM=..., so the GPU path's plumbing runs on CPU). Checks health,
    PID files, loopback binding, services.json, a refused second start, --status; the page's config
    picks both up and answers through them; --stop ends both by PID, with nothing left behind."""
    import asyncio
    import sys

    from r3rag.demo.app import build_app, config_from_args, parse_args
    from r3rag.testing.tiny_models import save_tiny_model

    model_dir = save_tiny_model(tmp_path / "tiny-policy")
    fake = tmp_path / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    run_dir = tmp_path / "run"
    ret_port, model_port = free_port(), free_port()
    start = ("--run-dir", str(run_dir), "--world-size", "tiny", "--retriever-port", str(ret_port),
             "--vllm-model", str(model_dir), "--model-port", str(model_port))
    pids: dict[str, int] = {}
    try:
        started = server_sh(*start, env={"VLLM": str(fake)})
        pids = {p.stem: int(p.read_text().split()[0]) for p in (run_dir / "pids").glob("*.pid")}
        assert started.returncode == 0, started.stderr
        ret_url, model_url = f"http://127.0.0.1:{ret_port}", f"http://127.0.0.1:{model_port}"
        assert f"retrieval service: {ret_url}" in started.stdout and f"model server:      {model_url} " in started.stdout
        assert set(pids) == {"retriever", "model"}
        for name, pid in pids.items():
            assert alive(pid) and os.getpgid(pid) == pid  # each leads its own process group
            assert (run_dir / "logs" / f"{name}.log").is_file()
        assert httpx.get(ret_url + "/health", timeout=10).json()["status"] == "ok"
        assert httpx.get(model_url + "/health", timeout=10).status_code == 200
        assert listening_addresses(ret_port) == {"127.0.0.1"} and listening_addresses(model_port) == {"127.0.0.1"}
        services = json.loads((run_dir / "services.json").read_text())
        assert services["retriever_url"] == ret_url and services["model_base_url"] == model_url
        assert Path(services["dataset"]).name == "train.jsonl"  # the tiny world has no dev set

        again = server_sh(*start, timeout=60, env={"VLLM": str(fake)})
        assert again.returncode == 2 and "already running" in again.stderr
        status = server_sh("--status", "--run-dir", str(run_dir), timeout=60)
        assert f"retriever  pid {pids['retriever']}" in status.stdout and status.stdout.count("healthy") == 2

        cfg = config_from_args(parse_args(["--run-dir", str(run_dir), "--set", "rollout.max_turn_tokens=8"]))
        assert cfg.policy.backend == "openai" and cfg.policy.tokenizer == str(model_dir)
        assert cfg.retrieval.urls == [ret_url]
        app = build_app(cfg)

        async def ask() -> list:
            return [u async for u in app.answer(app.runner.questions[0].question, "R3-RAG steps", 2, 2, 0.0)]

        status_html, card_html, _, path = asyncio.run(ask())[-1]
        assert "Model down" not in status_html and "Model failed" not in status_html and "r3-final" in card_html
        saved = json.loads(Path(path).read_text())
        assert saved["steps"] and saved["steps"][0]["raw"]  # text came back from the model server

        stopped = server_sh("--stop", "--run-dir", str(run_dir), timeout=60)
        assert stopped.returncode == 0
        for name, pid in pids.items():
            assert f"stopped {name} (pid {pid})" in stopped.stdout
        deadline = time.time() + 10
        while any(alive(p) for p in pids.values()) and time.time() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in pids.values())
        assert all(group_members(p) == [] for p in pids.values())
        assert not list((run_dir / "pids").glob("*.pid")) and not (run_dir / "services.json").exists()
        with pytest.raises(httpx.ConnectError):
            httpx.get(ret_url + "/health", timeout=5)
    finally:
        for pid in pids.values():
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)

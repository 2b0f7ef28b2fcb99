"""Every user-facing command answers a bad flag with one clear error line and exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPTS = [
    ["data/build_world.py"],
    ["data/validate.py"],
    ["data/validate_world.py"],
    ["benchmark/evaluate.py", "score"],
    ["benchmark/evaluate.py", "run"],
    ["benchmark/prepare_real_data.py"],
    ["tool/build_index.py"],
    ["tool/retrieval_server.py"],
    ["tool/prepare_wiki_corpus.py"],
    ["-m", "r3rag.quickstart"],
    ["benchmark/oracle_eval.py"],
]


@pytest.mark.parametrize("cmd", SCRIPTS, ids=lambda c: " ".join(c))
def test_bad_flag_is_one_error_line(cmd, repo_root):
    r = subprocess.run([sys.executable, *cmd, "--no-such-flag"], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ") and "--help" in lines[0]
    assert "Traceback" not in r.stderr


def test_bad_config_is_one_error_line(repo_root, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("rollout:\n  max_stepz: 3\n")
    r = subprocess.run([sys.executable, "benchmark/evaluate.py", "run", "--config", str(cfg), "--out", str(tmp_path / "o")],
                       cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: {cfg}: unknown key 'rollout.max_stepz'"]

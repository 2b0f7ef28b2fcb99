"""Running code inside OpenRLHF's own environment (.venvs/openrlhf, made by train/envs/openrlhf.sh).

Tests that need OpenRLHF call :func:`run_in_openrlhf`; when the environment is absent they skip,
unless ``R3RAG_REQUIRE_ENVS=1`` (CI after building it), where its absence is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("R3RAG_OPENRLHF_VENV", ROOT / ".venvs" / "openrlhf"))
PYTHON = VENV / "bin" / "python"


def require_openrlhf() -> Path:
    if not PYTHON.exists() or not any(VENV.glob(".r3rag-openrlhf-*")):
        msg = f"OpenRLHF's environment is not built ({VENV}): bash train/envs/openrlhf.sh"
        if os.environ.get("R3RAG_REQUIRE_ENVS") == "1":
            pytest.fail(msg + " (R3RAG_REQUIRE_ENVS=1)")
        pytest.skip(msg)
    return PYTHON


def run_in_openrlhf(*args: str, timeout: float = 600) -> dict:
    """Run tests/openrlhf_checks.py with ``args`` in OpenRLHF's environment; its JSON result."""
    python = require_openrlhf()
    # this checkout's r3rag first: the environment's editable install may point at another checkout
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), RAY_DEDUP_LOGS="0")
    proc = subprocess.run([str(python), str(ROOT / "tests" / "openrlhf_checks.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("R3RAG-RESULT ")]
    assert proc.returncode == 0 and lines, f"openrlhf_checks.py {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("R3RAG-RESULT "):])

"""Every command the README shows in a ``bash`` block runs as written on a fresh clone, on a CPU.

The commands are read from README.md's ``bash`` blocks (continuation lines joined, comments cut,
``&&`` split), so a command added to the README is checked without editing this test; a program
this test does not know how to run fails it until it is classified here. Commands that need GPUs,
a cluster or a Wikipedia index are shown in ``sh`` blocks instead; they are not run here, and
tests/test_doc_links.py checks that every file they name exists.

What runs, in a temporary folder (so every ``runs/...`` path lands there):

- every Python program and shell script: ``--help`` (exit 0, prints usage);
- every ``make`` target: ``make -n TARGET`` (the target exists; the quickstart and the whole test
  suite are not run from inside the test suite);
- for real, in README order: ``data/build_world.py``, ``tool/build_index.py``,
  ``tool/retrieval_server.py`` (with ``--port`` of a free port added: 8000 may be taken on a
  shared machine; stopped at the end), ``benchmark/evaluate.py run`` (its URL pointed at that
  port, ``--limit 2`` added: SmolLM2 over the world's dev questions is many minutes on a CPU),
  ``benchmark/evaluate.py score`` (``preds.jsonl`` = the predictions the run just wrote);
- the quickstart's ``--help``; its ``--limit 0`` after a limited run is checked where the
  evaluation folder decides it (a larger limit extends a run: ``benchmark/evaluate.py run`` with
  ``--limit 4``, then without a limit, in the same ``--out``).

The demo scripts (``startup/*.sh``) get ``--help`` here; tests/test_demo_server_sh.py and
tests/test_demo_browser.py run them.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: how each program the README shows is checked beyond --help
RUN = {"data/build_world.py", "tool/build_index.py", "tool/retrieval_server.py", "benchmark/evaluate.py"}
HELP_ONLY = {"startup/server.sh", "startup/startup_visualize.sh"}
MAKE_TARGETS_NOT_RUN = {"quickstart", "test"}


def readme_commands() -> list[list[str]]:
    """Each command of the README's ``bash`` blocks as an argv list."""
    text = README.read_text(encoding="utf-8")
    out: list[list[str]] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = re.split(r"\s+#\s", " " + line, maxsplit=1)[0].strip()
            for part in line.split("&&"):
                if part.strip():
                    out.append(shlex.split(part))
    return out


def program(argv: list[str]) -> str:
    if argv[0] == "make":
        return "make"
    if argv[0] == "bash" or argv[0].endswith("python"):
        return argv[1]
    return argv[0]


def test_the_readme_commands_are_all_known():
    progs = {program(a) for a in readme_commands()}
    assert progs, "no bash blocks found in README.md"
    unknown = progs - RUN - HELP_ONLY - {"make"}
    assert unknown == set(), f"README shows programs this test does not check: {sorted(unknown)}"
    assert {a[1] for a in readme_commands() if a[0] == "make"} <= MAKE_TARGETS_NOT_RUN | {"setup", "bench", "test-fast"}


def _argv(argv: list[str]) -> list[str]:
    """The README's argv with ``.venv/bin/python`` as this interpreter and scripts from the repo."""
    prog = program(argv)
    if argv[0] == "bash":
        return ["bash", str(ROOT / prog), *argv[2:]]
    return [sys.executable, str(ROOT / prog), *argv[2:]]


@pytest.mark.parametrize("prog", sorted(RUN | HELP_ONLY))
def test_help(prog, tmp_path):
    if prog not in {program(a) for a in readme_commands()}:
        pytest.skip(f"{prog} is no longer in the README")
    cmd = ["bash", str(ROOT / prog)] if prog.endswith(".sh") else [sys.executable, str(ROOT / prog)]
    r = subprocess.run([*cmd, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "usage" in (r.stdout + r.stderr).lower(), r.stderr


def test_make_targets_exist():
    for argv in readme_commands():
        if argv[0] == "make":
            r = subprocess.run(["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_entry_points_run_as_written(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    commands = [a for a in readme_commands() if program(a) in RUN]
    port = _free_port()
    server = None
    ran: list[str] = []
    try:
        for argv in commands:
            cmd = _argv(argv)
            prog = program(argv)
            if prog == "tool/retrieval_server.py":
                server = subprocess.Popen([*cmd, "--port", str(port)], cwd=tmp_path, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.2)
                else:
                    pytest.fail("the README's retrieval server did not answer /health within 120 s")
                ran.append(prog)
                continue
            if prog == "benchmark/evaluate.py" and argv[2] == "run":
                cmd = [c.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for c in cmd] + ["--limit", "2", "--no-progress"]
                assert server is not None, "the README runs the evaluation before starting its server"
            if prog == "benchmark/evaluate.py" and argv[2] == "score":
                preds = sorted(tmp_path.glob("runs/eval/*/predictions.jsonl"))
                assert preds, "no predictions for the README's score command"
                (tmp_path / "preds.jsonl").write_bytes(preds[0].read_bytes())
            r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, f"{' '.join(argv)}\n{r.stderr[-2000:]}"
            ran.append(f"{prog} {argv[2]}" if prog == "benchmark/evaluate.py" else prog)
            if prog == "benchmark/evaluate.py" and argv[2] == "score":
                assert json.loads(r.stdout.strip().splitlines()[-1])["n"] == 2
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
    assert ran == ["data/build_world.py", "tool/build_index.py", "tool/retrieval_server.py",
                   "benchmark/evaluate.py run", "benchmark/evaluate.py score"]
    assert (tmp_path / "runs" / "world" / "facts.jsonl").is_file()


def test_quickstart_help_and_a_growing_limit(tmp_path):
    """``python -m r3rag.quickstart --help`` runs, and a larger limit (``--limit 0``: all) extends an
    evaluation folder instead of being refused (it was: "holds a run with n_total=32"). The
    quickstart's evaluation stage runs :func:`r3rag.evaluation.runner.run_evaluation`; here it is
    driven through ``benchmark/evaluate.py run`` with the oracle (no model), as fast as it gets."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    h = subprocess.run([sys.executable, "-m", "r3rag.quickstart", "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert h.returncode == 0 and "--limit" in h.stdout and "0 = all" in h.stdout
    base = [sys.executable, str(ROOT / "benchmark" / "evaluate.py"), "run", "--method", "oracle", "--out", "runs/eval/oracle",
            "--no-progress", "--set", "dataset.world_dir=runs/world", "--set", "run.bootstrap=20"]
    first = subprocess.run([*base, "--limit", "4"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0 and "4 new, 0 already done" in first.stdout, first.stderr[-2000:]
    whole = subprocess.run(base, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    n_dev = sum(1 for line in (tmp_path / "runs" / "world" / "dev.jsonl").open() if line.strip())
    assert f"{n_dev - 4} new, 4 already done" in whole.stdout

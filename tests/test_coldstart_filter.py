"""Cold start: the correctness filter, the attempt schedule, judge failures, resume, bad input."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from r3rag.config import load_config
from r3rag.data.readers import read_questions
from r3rag.train.coldstart.builder import ColdStartBuilder, build_coldstart
from r3rag.train.coldstart.config import ColdStartConfig
from r3rag.train.coldstart.store import read_rows
from tests.sft_helpers import ROOT, ScriptedTeacher, make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("cs-world"))


def _cfg(world, out: Path, *extra: str) -> ColdStartConfig:
    w, idx = world
    return load_config(ColdStartConfig, None, [
        f"data.questions={w / 'train.jsonl'}", f"retriever.index_dir={idx}", "teacher.tokenizer=tiny",
        f"output.dir={out}", "output.progress=false", *extra,
    ])


def _scripted(world, out: Path, script_answers, *extra: str):
    """A builder on the first questions with a teacher answering ``script_answers[i]`` (per attempt)."""
    cfg = _cfg(world, out, f"data.limit={len(script_answers)}", *extra)
    questions = read_questions(cfg.data.questions, limit=len(script_answers))
    b = ColdStartBuilder(cfg, questions)
    script = {}
    for q, answers in zip(questions, script_answers):
        script[q.question] = [q.golden_answers[0] if a == "GOLD" else a for a in answers]
    b.backend = ScriptedTeacher(b.fmt, b.tokenizer, script)
    return b, questions


def test_wrong_answers_dropped_and_schedule_honoured(world, tmp_path):
    # q0: right at once; q1: wrong twice then right; q2: always wrong
    b, qs = _scripted(world, tmp_path / "out", [["GOLD"], ["nope", "no", "GOLD"], ["wrong"]],
                      "attempts.max_attempts=4", "attempts.temperatures=[0.0,0.9]")
    summary = b.run()
    assert summary["tried"] == 3 and summary["kept"] == 2
    assert summary["dropped"] == {"wrong_answer": 1}
    assert summary["attempts_per_kept"] == {"1": 1, "3": 1}
    temps = b.backend.temperatures
    assert temps[qs[0].question] == [0.0]
    assert temps[qs[1].question] == [0.0, 0.9, 0.9]
    assert temps[qs[2].question] == [0.0, 0.9, 0.9, 0.9]  # every attempt used, the first greedy
    kept = read_rows(tmp_path / "out", "trajectories")
    assert [t["question_id"] for t in kept] == [qs[0].id, qs[1].id]
    assert kept[1]["metadata"]["coldstart"] == {"attempt": 2, "temperature": 0.9, "verdict": "rule"}
    decisions = read_rows(tmp_path / "out", "decisions")
    assert decisions[2] == {"id": qs[2].id, "attempts": 4, "outcomes": ["wrong_answer"] * 4,
                            "hops": qs[2].metadata.get("hops"), "kept": False, "reason": "wrong_answer"}
    share = read_rows(tmp_path / "out", "sharegpt")
    assert [s["id"] for s in share] == [f"{qs[0].id}#0", f"{qs[1].id}#0"]


@pytest.mark.parametrize("policy,kept,reason,attempts", [
    ("reject", 0, "judge_failed", 3),        # judge silent: treated as wrong, every attempt used
    ("accept", 1, None, 1),                  # judge silent: the chain is kept
    ("drop_question", 0, "judge_failed", 1),  # judge silent: the question is given up at once
])
def test_judge_failure_policy(world, tmp_path, policy, kept, reason, attempts):
    b, qs = _scripted(world, tmp_path / "out", [["almost right"]], "attempts.max_attempts=3",
                      "filter.answer.judge_fallback=true", "filter.judge.base_url=http://127.0.0.1:9/v1",
                      "filter.judge.max_retries=0", "filter.judge.timeout_s=2", "filter.judge.cache_path=null",
                      f"filter.on_judge_failure={policy}")
    summary = b.run()
    assert summary["kept"] == kept
    d = read_rows(tmp_path / "out", "decisions")[0]
    assert d["attempts"] == attempts and d.get("reason") == reason
    if kept:
        assert summary["verdicts"] == {"judge_failed_accepted": 1}


def test_oracle_build_is_deterministic_and_varied(world, tmp_path):
    a = build_coldstart(_cfg(world, tmp_path / "a", "data.limit=40"))
    b = build_coldstart(_cfg(world, tmp_path / "b", "data.limit=40"))
    for part in ("trajectories", "sharegpt", "alpaca_steps", "decisions"):
        assert (tmp_path / "a" / part / "part-00000-of-00001.jsonl").read_bytes() == \
            (tmp_path / "b" / part / "part-00000-of-00001.jsonl").read_bytes()
    assert a["kept"] == b["kept"] > 10
    trajs = read_rows(tmp_path / "a", "trajectories")
    openers = {t["steps"][0]["analysis"].split(":")[0] for t in trajs}
    assert len(openers) >= 3  # several wordings, not one script
    golds = {q.id: q for q in read_questions(world[0] / "train.jsonl", limit=40)}
    paraphrased = sum(1 for t in trajs for s in t["steps"] if s["query"] and s["query"] not in
                      [d["question"] for d in golds[t["question_id"]].metadata["decomposition"]] + [t["question"]])
    assert paraphrased > 0  # some queries are not the literal sub-question
    # a different seed writes different text for the same questions
    c = _cfg(world, tmp_path / "c", "data.limit=40", "teacher.variety.seed=1")
    build_coldstart(c)
    assert (tmp_path / "c" / "sharegpt" / "part-00000-of-00001.jsonl").read_bytes() != \
        (tmp_path / "a" / "sharegpt" / "part-00000-of-00001.jsonl").read_bytes()


def test_resume_after_partial_chunk_is_byte_identical(world, tmp_path):
    full = tmp_path / "full"
    build_coldstart(_cfg(world, full, "data.limit=30", "output.chunk_size=7"))
    # simulate a kill while chunk 2 was being written: state keeps 2 chunks, parts hold a torn line
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    state = cut / "state" / "part-00000-of-00001.jsonl"
    lines = state.read_text().splitlines(keepends=True)
    assert len(lines) == 5
    state.write_text("".join(lines[:2]) + lines[2][:10])
    sizes = json.loads(lines[1])["sizes"]
    for part, size in sizes.items():
        p = cut / part / "part-00000-of-00001.jsonl"
        data = p.read_bytes()
        p.write_bytes(data[: size + (len(data) - size) // 2])  # half of the next chunk, torn mid-line
    build_coldstart(_cfg(world, cut, "data.limit=30", "output.chunk_size=7"))
    for part in sizes:
        assert (cut / part / "part-00000-of-00001.jsonl").read_bytes() == (full / part / "part-00000-of-00001.jsonl").read_bytes()
    assert len((cut / "state" / "part-00000-of-00001.jsonl").read_text().splitlines()) == 5


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, str(ROOT / "train" / "build_coldstart.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=str(ROOT))


@pytest.mark.slow
def test_sigkill_resume_is_byte_identical(world, tmp_path):
    w, idx = world
    args = ["--set", f"data.questions={w / 'train.jsonl'}", "--set", f"retriever.index_dir={idx}",
            "--set", "teacher.tokenizer=tiny", "--set", "output.chunk_size=1", "--set", "output.progress=false"]
    ref = _cli(*args, "--out", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    n_chunks = len((tmp_path / "ref" / "state" / "part-00000-of-00001.jsonl").read_text().splitlines())
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train" / "build_coldstart.py"), *args, "--out", str(out)],
                            env=env, cwd=str(ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = out / "state" / "part-00000-of-00001.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if state.is_file() and len(state.read_text().splitlines()) >= 3:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the build finished before it could be killed"
    assert len(state.read_text().splitlines()) < n_chunks
    again = _cli(*args, "--out", str(out))
    assert again.returncode == 0, again.stderr
    for part in ("trajectories", "sharegpt", "alpaca_steps", "decisions"):
        assert (out / part / "part-00000-of-00001.jsonl").read_bytes() == \
            (tmp_path / "ref" / part / "part-00000-of-00001.jsonl").read_bytes()


def test_bad_input_is_one_line(world, tmp_path):
    w, idx = world
    bad = tmp_path / "bad.jsonl"
    lines = (w / "train.jsonl").read_text().splitlines()[:3]
    rec = json.loads(lines[1])
    del rec["golden_answers"]
    bad.write_text("\n".join([lines[0], json.dumps(rec), lines[2]]) + "\n")
    base = ["--set", "teacher.tokenizer=tiny", "--set", "output.progress=false"]
    r = _cli(*base, "--set", f"data.questions={bad}", "--set", f"retriever.index_dir={idx}", "--out", str(tmp_path / "o1"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and f"{bad}:2" in r.stderr
    r = _cli(*base, "--set", f"data.questions={w / 'train.jsonl'}", "--set", "retriever.urls=[http://127.0.0.1:9]",
             "--set", "retriever.retries=0", "--set", "retriever.timeout_s=2", "--out", str(tmp_path / "o2"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: retriever unreachable")
    r = _cli(*base, "--set", f"data.questions={w / 'train.jsonl'}", "--set", f"retriever.index_dir={idx}",
             "--set", "teacher.kind=openai", "--set", "teacher.base_url=http://127.0.0.1:9/v1", "--out", str(tmp_path / "o3"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error: teacher unreachable")
    assert not list((tmp_path / "o3").glob("sharegpt/*.jsonl")) or \
        all(p.stat().st_size == 0 for p in (tmp_path / "o3").glob("sharegpt/*.jsonl"))

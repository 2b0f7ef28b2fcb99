"""``python -m r3rag.quickstart`` end to end at a tiny scale: a tiny world, a tiny random model, a
few questions, through every stage; SIGKILL in the middle of each long stage, then a rerun that
finishes without losing or doubling anything.

The training stages here are the stand-in programs of ``tests/quickstart_standins/`` (the same
command-line contract as train/build_coldstart.py, train/sft.py and train/rl.py, each resumable),
so the pipeline's own machinery is what is tested: child processes, markers, wiring, evaluation of
every checkpoint, the report. ``test_quickstart_real_stages.py`` runs the real programs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "quickstart_standins"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from r3rag.testing.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("qs") / "tiny")


def write_preset(tmp_path: Path, model: Path, questions: int = 4, batch: int = 4, workers: int = 1) -> Path:
    preset = tmp_path / "preset.yaml"
    preset.write_text(f"""
preset: tiny
work: {tmp_path / 'work'}
world: {{seed: 0, size: tiny, clusters: 10, questions_per_cluster: {questions}}}
model: {{base: {model}}}
coldstart: {{script: {STANDINS / 'coldstart.py'}, config: null, limit: 6}}
sft: {{script: {STANDINS / "sft.py"}, config: null, out_arg: output_dir}}
rl: {{script: {STANDINS / 'rl.py'}, config: null, reward_check: 4}}
eval:
  limit: {questions}
  base_methods: [rag]
  batch_size: {batch}
  workers: {workers}
  set: [run.progress=false, rollout.max_new_tokens=24, rollout.max_turn_tokens=12, rollout.max_steps=2, method.answer_max_tokens=8]
report: {{bootstrap: 200}}
""")
    return preset


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", **extra})
    return e


def quickstart(preset: Path, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=env(**extra))


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []


def test_every_stage_runs_and_its_outputs_load_in_the_next(tmp_path, tiny_model):
    preset = write_preset(tmp_path, tiny_model)
    r = quickstart(preset)
    assert r.returncode == 0, r.stderr[-3000:]
    work = tmp_path / "work"
    stages = ["world", "index", "coldstart", "sft", "rl", "eval", "report"]
    for i, s in enumerate(stages, 1):
        assert f"[{i}/7] {s}" in r.stdout and "done in" in r.stdout
    assert (work / "world" / "manifest.json").is_file() and (work / "index" / "manifest.json").is_file()
    assert json.loads((work / "coldstart" / "summary.json").read_text())["kept"] == 3
    # the SFT checkpoint is what RL started from, and each checkpoint is what its evaluation loaded
    assert (work / "sft" / "final" / "config.json").is_file() and (work / "rl" / "final" / "config.json").is_file()
    runs = {d.name: json.loads((d / "results.json").read_text()) for d in (work / "eval").iterdir()}
    assert set(runs) == {"base-rag", "sft", "rl", "rl-null"}
    assert runs["sft"]["model"] == str((work / "sft" / "final").resolve())
    assert runs["rl"]["model"] == str((work / "rl" / "final").resolve())
    assert runs["rl-null"]["model"] == str((work / "rl" / "null-control").resolve())
    assert all(r_["n"] == 4 for r_ in runs.values())
    ids = [{row["id"] for row in jsonl(work / "eval" / name / "predictions.jsonl")} for name in runs]
    assert ids[0] == ids[1] == ids[2] == ids[3]  # the same held-out questions
    # the null control is SFT moved by RL's update with a random sign per parameter: |null - sft| == |rl - sft|
    from r3rag.train.rl.update_noise import load_weights

    sft_w, rl_w, null_w = (load_weights(work / p) for p in ("sft/final", "rl/final", "rl/null-control"))
    moved = [k for k in sft_w if not (rl_w[k] == sft_w[k]).all()]
    assert moved and all(((null_w[k] - sft_w[k]).abs() - (rl_w[k] - sft_w[k]).abs()).abs().max() < 1e-6 for k in sft_w)
    assert any((null_w[k] != rl_w[k]).any() for k in moved)
    dev = {q["id"] for q in jsonl(work / "world" / "dev.jsonl")}
    assert ids[0] <= dev
    md = (work / "report" / "quickstart.md").read_text()
    for needle in ("| base (rag, prompted) | 4 |", "| SFT | 4 |", "| RL | 4 |", "| SFT - base | 4 |", "| RL - SFT | 4 |",
                   "| RL null control | 4 |", "| RL - null control | 4 |",
                   "SFT beat the prompted base:", "goal +30 EM",
                   "RL moved its training reward and did no harm beyond the null control: ",
                   "- Held-out EM, RL - SFT: ", "- Held-out EM, RL - null control: ",
                   "Training reward on 4 of RL's own training questions", "1.000 before, 1.750 after",
                   "A held-out gain over SFT is not expected at this size and budget", "on 32 trajectories",
                   "not the training run", "r3rag.evaluation.replicates",
                   "trained parameters moved", "on pure-noise gradients",  # the RL update against AdamW's noise walk
                   "![RL curves](rl_curves.png)", "| coldstart |",
                   "## Evidence found and answers read", "SFT -> RL, by whether each found every gold passage",
                   f"--model {(work / 'rl' / 'final').resolve()}"):
        assert needle in md, needle
    html = (work / "report" / "examples.html").read_text()
    assert html.count('class="r3-pair"') == 2 and "r3-final" in html and "before: base" in html and "after: RL" in html
    assert (work / "report" / "rl_curves.png").stat().st_size > 1000
    paired = json.loads((work / "report" / "paired.json").read_text())
    assert set(paired) == {"sft_vs_base", "rl_vs_sft", "rl_vs_base", "rl_vs_null"} and paired["rl_vs_sft"]["em"]["n"] == 4
    assert "SFT beat the prompted base:" in r.stdout and "RL moved its training reward" in r.stdout
    claims = {c["name"]: c for c in json.loads((work / "report" / "claims.json").read_text())}
    assert set(claims) == {"sft_vs_base", "rl_training"} and claims["sft_vs_base"]["goal"] == 30.0
    rl_claim = claims["rl_training"]
    assert rl_claim["reward"]["n"] == 4 and rl_claim["reward"]["diff"] == 0.75
    # the claim is what its two numbers say: the reward rose, and RL is not below the null control
    assert rl_claim["holds"] == (rl_claim["reward"]["ci95"][0] > 0 and rl_claim["vs_null"]["ci95"][1] >= 0)

    # a rerun skips everything and rewrites the same report
    r2 = quickstart(preset)
    assert r2.returncode == 0, r2.stderr[-2000:]
    assert r2.stdout.count("skip: done earlier") == 6
    assert (work / "report" / "quickstart.md").read_text().split("## Time")[0] == md.split("## Time")[0]
    # a subset, and the evaluation-only form: --stages eval,report on what is there
    r3 = quickstart(preset, "--stages", "eval,report")
    assert r3.returncode == 0 and "[1/2] eval      skip" in r3.stdout


def _kill_when(proc: subprocess.Popen, ready, timeout: float = 240) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the quickstart ended (status {proc.returncode}) before the kill point:\n"
                                 f"{proc.stdout.read()[-3000:] if proc.stdout else ''}")
        if ready():
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the kill point never came")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (ProcessLookupError, OSError):
        return False


def test_sigkill_in_the_middle_of_each_stage_resumes(tmp_path, tiny_model):
    preset = write_preset(tmp_path, tiny_model, questions=8, batch=1)
    work = tmp_path / "work"
    done = lambda s: (work / ".done" / f"{s}.json").is_file()  # noqa: E731
    kill_points = {
        "coldstart": lambda: len(jsonl(work / "coldstart" / "attempts.jsonl")) >= 2,
        "sft": lambda: len(jsonl(work / "sft" / "trainer_log.jsonl")) >= 2,
        "rl": lambda: len(jsonl(work / "rl" / "metrics.jsonl")) >= 2,
        "eval": lambda: len(jsonl(work / "eval" / "sft" / "predictions.jsonl")) >= 2,
    }
    for stage, ready in kill_points.items():
        proc = subprocess.Popen([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset)], cwd=REPO, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(STANDIN_SLEEP="0.4"))
        _kill_when(proc, ready)
        assert not done(stage), f"{stage} finished before the kill: not a mid-stage kill"
        if stage != "eval":
            pids = [r["pid"] for r in jsonl(work / stage / "standin_runs.jsonl")]
            time.sleep(1.0)
            assert not _alive(pids[-1]), f"the {stage} program outlived the SIGKILLed quickstart"
    r = quickstart(preset, STANDIN_SLEEP="0")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for s in ("world", "index", "coldstart", "sft", "rl", "eval"):
        assert done(s)
    # nothing lost, nothing doubled
    attempts = [a["id"] for a in jsonl(work / "coldstart" / "attempts.jsonl")]
    assert len(attempts) == len(set(attempts)) == 6
    assert [x["current_steps"] for x in jsonl(work / "sft" / "trainer_log.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert [x["iteration"] for x in jsonl(work / "rl" / "metrics.jsonl")] == [1, 2, 3, 4]
    for name in ("base-rag", "sft", "rl"):
        rows = [x["id"] for x in jsonl(work / "eval" / name / "predictions.jsonl")]
        assert len(rows) == len(set(rows)) == 8, name
    # each killed training stage was started twice (killed + resumed), the finished ones not again
    for s in ("coldstart", "sft", "rl"):
        assert len(jsonl(work / s / "standin_runs.jsonl")) == 2, s


def _processes_mentioning(text: str) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd and _alive(int(d.name)):
                pids.append(int(d.name))
    return pids


def test_a_sharded_evaluation_killed_midway_resumes_without_losing_or_doubling(tmp_path, tiny_model):
    """eval.workers=2: SIGKILL the quickstart while both shard processes of the SFT run evaluate;
    the shard processes die with it; the rerun finishes each shard and merges 8 rows per run."""
    preset = write_preset(tmp_path, tiny_model, questions=8, batch=1, workers=2)
    work = tmp_path / "work"
    shard0 = work / "eval" / "sft" / "shards" / "0-of-2" / "predictions.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env(STANDIN_SLEEP="0"))
    _kill_when(proc, lambda: len(jsonl(shard0)) >= 1)
    assert not (work / ".done" / "eval.json").is_file()
    time.sleep(1.5)
    assert _processes_mentioning(str(work / "eval")) == [], "a shard process outlived the SIGKILLed quickstart"
    r = quickstart(preset)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "sft: 2 shard processes of 1 thread(s) each" in r.stdout
    dev_ids = [q["id"] for q in jsonl(work / "world" / "dev.jsonl")][:8]
    for name in ("base-rag", "sft", "rl"):
        rows = [x["id"] for x in jsonl(work / "eval" / name / "predictions.jsonl")]
        assert sorted(rows) == sorted(dev_ids), name
        shard_rows = [x["id"] for i in (0, 1) for x in jsonl(work / "eval" / name / "shards" / f"{i}-of-2" / "predictions.jsonl")]
        assert sorted(shard_rows) == sorted(dev_ids), name
        assert json.loads((work / "eval" / name / "results.json").read_text())["n"] == 8


def test_a_stage_that_produced_nothing_usable_stops_the_pipeline(tmp_path, tiny_model):
    preset = write_preset(tmp_path, tiny_model)
    r = quickstart(preset, "--stages", "world-rl", STANDIN_BROKEN="sft")
    assert r.returncode == 3
    assert "error: a stage produced nothing usable: SFT loss did not fall (2.000 -> 2.000" in r.stderr
    assert r.stderr.strip().endswith("(fix the cause, then rerun with --redo sft)")
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "work" / ".done" / "sft.json").exists()
    assert not (tmp_path / "work" / "rl").exists()
    r = quickstart(preset, "--stages", "world-coldstart", "--redo", "coldstart", STANDIN_BROKEN="coldstart")
    assert r.returncode == 3 and "cold start kept 0 trajectories (of 6 questions" in r.stderr
    r = quickstart(preset, "--stages", "world-rl", "--redo", "coldstart", STANDIN_BROKEN="rl")
    assert r.returncode == 3 and "RL reward stayed at 0.000" in r.stderr


def test_bad_flags_and_presets_are_one_line(tmp_path, tiny_model):
    preset = write_preset(tmp_path, tiny_model)
    for args, needle in ((["--stages", "evl"], "unknown stage 'evl'"), (["--set", "eval.limitt=3"], "unknown key 'eval.limitt'"),
                         (["--preset", "nope"], "no such preset"), (["--set", "eval.base_methods=[magic]"], "unknown method 'magic'")):
        r = subprocess.run([sys.executable, "-m", "r3rag.quickstart", "--preset", str(preset), *args] if args[0] != "--preset"
                           else [sys.executable, "-m", "r3rag.quickstart", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=120, env=env())
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and needle in r.stderr, (args, r.stderr)
    help_ = subprocess.run([sys.executable, "-m", "r3rag.quickstart", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "--stages" in help_.stdout and "--fast" in help_.stdout and "coldstart" in help_.stdout

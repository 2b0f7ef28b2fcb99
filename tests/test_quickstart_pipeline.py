"""The quickstart's pipeline machinery: done markers, resume, stale settings, services always
stopped (failure, Ctrl-C, SIGTERM), child processes that die with the pipeline, usability checks,
paired bootstrap intervals. Stand-in stage functions here; the real stages run in
test_quickstart_e2e.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from r3rag.errors import ConfigError
from r3rag.evaluation.paired import means_with_ci, paired_differences
from r3rag.pipeline import checks
from r3rag.pipeline.child import ChildFailed, run_child, run_children
from r3rag.pipeline.config import QuickstartConfig
from r3rag.pipeline.runner import Context, Stage, StageUnusable, Terminated, run_pipeline
from r3rag.pipeline.stages import parse_stages, retrieval_url, run_index, run_world
from r3rag.pipeline.state import PipelineState

REPO = Path(__file__).resolve().parents[1]


def _ctx(tmp_path: Path, **cfg) -> Context:
    lines: list[str] = []
    ctx = Context(cfg=QuickstartConfig(work=str(tmp_path / "work"), **cfg), work=tmp_path / "work", repo_root=REPO,
                  echo=lines.append, echo_children=False)
    ctx.lines = lines  # type: ignore[attr-defined]
    return ctx


def _counting_stages(calls: dict[str, int], knob: dict[str, int]) -> list[Stage]:
    def make(name: str):
        def run(ctx: Context) -> dict:
            calls[name] = calls.get(name, 0) + 1
            with (ctx.stage_dir(name) / "out.txt").open("a") as fh:  # appends: a redo must start from an empty folder
                fh.write(f"{name} {knob.get(name, 0)}\n")
            return {"line": f"{name} ran"}
        return run

    return [
        Stage("a", "first", make("a"), settings=lambda ctx: knob.get("a", 0)),
        Stage("b", "second", make("b"), needs=("a",), settings=lambda ctx: knob.get("b", 0)),
        Stage("c", "third", make("c"), needs=("b",)),
    ]


def test_rerun_skips_finished_stages(tmp_path):
    calls: dict[str, int] = {}
    ctx = _ctx(tmp_path)
    stages = _counting_stages(calls, {})
    out = run_pipeline(ctx, stages, ["a", "b", "c"])
    assert [out[s]["status"] for s in "abc"] == ["ran"] * 3
    assert calls == {"a": 1, "b": 1, "c": 1}
    marker = PipelineState(ctx.work).get("b")
    assert marker["summary"]["line"] == "b ran" and marker["elapsed_s"] >= 0
    progress = [line for line in ctx.lines if "done in" in line]
    assert len(progress) == 3 and progress[0].startswith("[1/3] a")

    ctx2 = _ctx(tmp_path)
    out = run_pipeline(ctx2, _counting_stages(calls, {}), ["a", "b", "c"])
    assert [out[s]["status"] for s in "abc"] == ["skipped"] * 3
    assert calls == {"a": 1, "b": 1, "c": 1}
    assert any("skip: done earlier" in line for line in ctx2.lines)


def test_a_torn_marker_counts_as_not_done(tmp_path):
    calls: dict[str, int] = {}
    ctx = _ctx(tmp_path)
    run_pipeline(ctx, _counting_stages(calls, {}), ["a"])
    PipelineState(ctx.work).marker_path("a").write_text('{"stage": "a", "finger')  # a write cut short
    run_pipeline(_ctx(tmp_path), _counting_stages(calls, {}), ["a"])
    assert calls["a"] == 2


def test_changed_settings_refuse_the_stale_marker_and_redo_cascades(tmp_path):
    calls: dict[str, int] = {}
    knob = {"a": 0}
    run_pipeline(_ctx(tmp_path), _counting_stages(calls, knob), ["a", "b", "c"])
    knob["a"] = 1  # a's settings change: a, and through the fingerprint chain b and c, are stale
    with pytest.raises(ConfigError, match="stage a .* other settings.*--redo a"):
        run_pipeline(_ctx(tmp_path), _counting_stages(calls, knob), ["a", "b", "c"])
    with pytest.raises(ConfigError, match="stage b .* other settings"):
        run_pipeline(_ctx(tmp_path), _counting_stages(calls, knob), ["b"])
    out = run_pipeline(_ctx(tmp_path), _counting_stages(calls, knob), ["a", "b", "c"], redo=["a"])
    assert [out[s]["status"] for s in "abc"] == ["ran"] * 3
    assert calls == {"a": 2, "b": 2, "c": 2}
    assert (tmp_path / "work" / "a" / "out.txt").read_text() == "a 1\n"
    assert (tmp_path / "work" / "c" / "out.txt").read_text() == "c 0\n"  # downstream outputs were wiped too


def test_redoing_a_checkpoint_drops_only_its_evaluations(tmp_path):
    from r3rag.pipeline.stages import reset_eval

    ctx = _ctx(tmp_path, stages=["world", "index", "sft", "rl", "eval"], eval={"base_methods": ["rag"]})
    for name in ("base-rag", "sft", "rl"):
        (ctx.work / "eval" / name).mkdir(parents=True)
    reset_eval(ctx, {"rl", "report"})
    assert sorted(p.name for p in (ctx.work / "eval").iterdir()) == ["base-rag", "sft"]
    reset_eval(ctx, {"index"})
    assert list((ctx.work / "eval").iterdir()) == []


def test_the_evaluation_runs_trained_checkpoints_before_the_gguf_base(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import r3rag.evaluation.runner as runner
    from r3rag.pipeline import stages
    from r3rag.pipeline.state import PipelineState

    ctx = _ctx(tmp_path, stages=["world", "index", "sft", "rl", "eval"], eval={"base_methods": ["rag", "direct"]})
    null = ctx.work / "rl" / "null-control"  # RL's null control, written by the RL stage
    null.mkdir(parents=True)
    (null / "config.json").write_text("{}")
    (null / "model.safetensors").write_text("")
    for stage in ("sft", "rl"):
        (ctx.work / stage / "final").mkdir(parents=True)
        PipelineState(ctx.work).mark_done(stage, "fp", {"checkpoint": str(ctx.work / stage / "final"),
                                                        **({"null_control": str(null)} if stage == "rl" else {})}, 1.0)
    order: list[str] = []

    def fake_run_evaluation(cfg, out_dir):
        order.append(Path(out_dir).name)
        return SimpleNamespace(results={"metrics": {"em": 1.0}, "n": 3}, out_dir=out_dir, new=3, skipped=0)

    monkeypatch.setattr(runner, "run_evaluation", fake_run_evaluation)
    monkeypatch.setattr(stages, "retrieval_url", lambda ctx: "http://127.0.0.1:9")
    summary = stages.run_eval(ctx)
    assert order == ["sft", "rl", "rl-null", "base-rag", "base-direct"]
    assert list(summary["runs"]) == ["base-rag", "base-direct", "sft", "rl", "rl-null"]  # the table's order
    assert summary["runs"]["rl"]["model"] == str(ctx.work / "rl" / "final")
    assert summary["runs"]["rl-null"]["model"] == str(null) and summary["runs"]["rl-null"]["role"] == "rl_null"
    # redoing RL drops its null control's evaluation too, not the base model's
    for name in order:
        (ctx.work / "eval" / name).mkdir(parents=True, exist_ok=True)
    stages.reset_eval(ctx, {"rl"})
    assert sorted(p.name for p in (ctx.work / "eval").iterdir()) == ["base-direct", "base-rag", "sft"]


def test_a_stage_whose_inputs_are_missing_is_one_clear_error(tmp_path):
    calls: dict[str, int] = {}
    with pytest.raises(ConfigError, match="stage c needs stage b's outputs"):
        run_pipeline(_ctx(tmp_path), _counting_stages(calls, {}), ["c"])
    assert calls == {}
    with pytest.raises(ConfigError, match="unknown stage 'x'"):
        run_pipeline(_ctx(tmp_path), _counting_stages(calls, {}), ["x"])


def test_evaluating_a_checkpoint_that_was_never_trained_names_both_ways_out(tmp_path):
    from r3rag.pipeline.stages import checkpoint_of, eval_runs
    from r3rag.pipeline.state import PipelineState

    ctx = _ctx(tmp_path, stages=["world", "index", "sft", "rl", "eval"], eval={"base_methods": ["rag"]})
    assert [r["name"] for r in eval_runs(ctx)] == ["base-rag", "sft", "rl", "rl-null"]
    sft = ctx.work / "sft" / "final"
    sft.mkdir(parents=True)
    PipelineState(ctx.work).mark_done("sft", "fp", {"checkpoint": str(sft)}, 1.0)
    assert checkpoint_of(ctx, "sft") == str(sft)
    with pytest.raises(ConfigError, match=r"no rl checkpoint .*--stages rl first.*--set rl\.enabled=false"):
        checkpoint_of(ctx, "rl")
    with pytest.raises(ConfigError, match=r"no rl checkpoint"):  # RL's null control needs RL
        checkpoint_of(ctx, "rl_null")
    ctx.cfg.rl.enabled = False  # what --set rl.enabled=false does: RL leaves the evaluation
    assert [r["name"] for r in eval_runs(ctx)] == ["base-rag", "sft"]


def test_a_finished_training_stage_leaves_its_final_model_not_its_resume_checkpoints(tmp_path):
    from r3rag.pipeline.training import drop_resume_checkpoints

    ctx = _ctx(tmp_path)
    made = ["sft/checkpoint-25/optimizer.pt", "sft/checkpoint-50/optimizer.pt", "sft/model.safetensors",
            "sft/trainer_log.jsonl", "rl/checkpoints/iter_000005/policy.pt", "rl/stage2/checkpoints/iter_000003/policy.pt",
            "rl/final/model.safetensors", "rl/metrics.jsonl"]
    for rel in made:
        (ctx.work / rel).parent.mkdir(parents=True, exist_ok=True)
        (ctx.work / rel).write_text("x")
    left = lambda: sorted(str(p.relative_to(ctx.work)) for p in ctx.work.rglob("*") if p.is_file() and ".done" not in p.parts)  # noqa: E731
    ctx.cfg.sft.keep_resume_checkpoints = ctx.cfg.rl.keep_resume_checkpoints = True
    assert drop_resume_checkpoints(ctx, "sft") == drop_resume_checkpoints(ctx, "rl") == []
    assert left() == sorted(made)
    ctx.cfg.sft.keep_resume_checkpoints = ctx.cfg.rl.keep_resume_checkpoints = False
    # the model the stage recorded as its output is never removed, even inside a checkpoint folder
    PipelineState(ctx.work).mark_done("sft", "fp", {"checkpoint": str(ctx.work / "sft" / "checkpoint-50")}, 1.0)
    assert [p.name for p in drop_resume_checkpoints(ctx, "sft")] == ["checkpoint-25"]
    PipelineState(ctx.work).mark_done("sft", "fp", {"checkpoint": str(ctx.work / "sft")}, 1.0)
    assert [p.name for p in drop_resume_checkpoints(ctx, "sft")] == ["checkpoint-50"]
    assert len(drop_resume_checkpoints(ctx, "rl")) == 2  # every RL stage's checkpoints/
    assert left() == ["rl/final/model.safetensors", "rl/metrics.jsonl", "sft/model.safetensors", "sft/trainer_log.jsonl"]


def test_a_checkpoint_cleanup_that_fails_is_a_warning_not_a_crash(tmp_path, monkeypatch):
    from r3rag.pipeline import training

    ctx = _ctx(tmp_path)
    (ctx.work / "rl" / "checkpoints" / "iter_000001").mkdir(parents=True)

    def refuse(path, *a, **k):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(training.shutil, "rmtree", refuse)
    training.clean_after("rl")(ctx)
    assert any("could not delete" in line and "Permission denied" in line for line in ctx.lines)
    monkeypatch.undo()
    training.clean_after("rl")(ctx)
    assert "deleted 1 resume checkpoint folder(s)" in ctx.lines[-1]
    assert not (ctx.work / "rl" / "checkpoints").exists()


def test_after_done_runs_once_the_stage_is_marked_done_and_not_on_a_skip(tmp_path):
    seen: list[bool] = []
    ctx = _ctx(tmp_path)
    stages = [Stage("a", "first", lambda ctx: {"line": "a"},
                    after_done=lambda ctx: seen.append(PipelineState(ctx.work).is_done("a", ctx.fingerprints["a"])))]
    run_pipeline(ctx, stages, ["a"])
    run_pipeline(ctx, stages, ["a"])  # skipped: nothing to clean again
    assert seen == [True]


def test_parse_stages_prefixes_ranges_and_subsets():
    assert parse_stages("world-sft") == ["world", "index", "coldstart", "sft"]
    assert parse_stages("report,eval") == ["eval", "report"]
    assert parse_stages("rl-") == ["rl", "eval", "report"]
    assert parse_stages("all")[-1] == "report"
    with pytest.raises(ConfigError, match="unknown stage 'evl'"):
        parse_stages("evl")
    with pytest.raises(ConfigError, match="comes after"):
        parse_stages("sft-world")


# --- the retrieval service is stopped however the pipeline ends --------------------------------------


def _port_open(url: str) -> bool:
    host, port = url.rsplit("//", 1)[1].split(":")
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((host, int(port))) == 0


def _world_stages(seen: list[str], how: str) -> list[Stage]:
    def boom(ctx: Context) -> dict:
        url = retrieval_url(ctx)
        seen.append(url)
        assert _port_open(url)
        if how == "error":
            raise RuntimeError("the stage failed")
        if how == "ctrl-c":
            raise KeyboardInterrupt
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        return {}

    return [Stage("world", "world", run_world), Stage("index", "index", run_index, needs=("world",)),
            Stage("boom", "boom", boom, needs=("index",))]


@pytest.mark.parametrize("how,exc", [("error", RuntimeError), ("ctrl-c", KeyboardInterrupt), ("sigterm", Terminated)])
def test_the_retrieval_service_is_stopped_on_failure_ctrl_c_and_sigterm(tmp_path, how, exc):
    ctx = _ctx(tmp_path, world={"size": "tiny", "clusters": 10, "questions_per_cluster": 2}, eval={"limit": 2})
    seen: list[str] = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(exc):
        run_pipeline(ctx, _world_stages(seen, how), ["world", "index", "boom"])
    assert seen and not _port_open(seen[0])
    assert "stopped: retrieval service" in ctx.lines
    assert signal.getsignal(signal.SIGTERM) == before  # the handler is put back
    assert PipelineState(ctx.work).is_done("index") and not PipelineState(ctx.work).is_done("boom")


# --- child processes ---------------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (dead, not yet reaped by its new parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    end = time.time() + timeout
    while time.time() < end:
        if path.is_file() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)"


GRANDPARENT = (
    "import subprocess, sys, time; "
    "subprocess.Popen([sys.executable, '-c', {sleeper!r}, sys.argv[1]]); time.sleep(120)"
)


def test_a_child_and_its_own_children_die_when_the_pipeline_is_sigkilled(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    program = GRANDPARENT.format(sleeper=SLEEPER)  # like train/sft.py, which starts LLaMA-Factory
    parent_code = textwrap.dedent(f"""
        import sys
        from r3rag.pipeline.child import run_child
        run_child([sys.executable, "-c", {program!r}, {str(pid_file)!r}], echo=False)
    """)
    parent = subprocess.Popen([sys.executable, "-c", parent_code], cwd=REPO)
    grandchild = int(_wait_for(pid_file))
    group = os.getpgid(grandchild)
    assert _alive(grandchild) and group != os.getpgid(0)
    parent.kill()  # SIGKILL: none of the parent's own cleanup runs
    parent.wait(timeout=10)
    end = time.time() + 10
    while _alive(grandchild) and time.time() < end:
        time.sleep(0.05)
    assert not _alive(grandchild), "the stage's program outlived its SIGKILLed pipeline"
    while _group_members(group) and time.time() < end:  # the others exit in the same instant, give or take
        time.sleep(0.05)
    assert _group_members(group) == [], "part of the stage's process group is still running"


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def test_a_child_is_stopped_when_the_wait_is_interrupted(tmp_path):
    pid_file = tmp_path / "child.pid"

    def interrupt_soon(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt_soon)
    try:
        import threading

        def arm():
            _wait_for(pid_file)
            signal.setitimer(signal.ITIMER_REAL, 0.2)

        threading.Thread(target=arm, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            run_child([sys.executable, "-c", SLEEPER, str(pid_file)], echo=False, grace_s=2)
    finally:
        signal.signal(signal.SIGALRM, old)
    child = int(pid_file.read_text())
    time.sleep(0.2)
    assert not _alive(child)


def test_a_failing_child_is_one_error_naming_its_log(tmp_path):
    log = tmp_path / "log.txt"
    with pytest.raises(ChildFailed, match="exited with status 3.*log.txt"):
        run_child([sys.executable, "-c", "print('about to fail'); raise SystemExit(3)"], log_path=log, echo=False)
    assert "about to fail" in log.read_text()
    with pytest.raises(ChildFailed, match="ran past its 1 s limit"):
        run_child([sys.executable, "-c", "import time; time.sleep(30)"], echo=False, timeout_s=1, grace_s=1)


def test_children_run_at_once_and_one_failure_stops_the_others(tmp_path):
    """run_children: two programs overlap in time (each waits for the other's file), and when a
    third fails, the one still running is stopped and the error names the failed one's log."""
    meet = ("import pathlib, sys, time; pathlib.Path(sys.argv[1]).write_text('x'); "
            "end = time.time() + 20\nwhile not pathlib.Path(sys.argv[2]).exists() and time.time() < end: time.sleep(0.05)\n"
            "sys.exit(0 if pathlib.Path(sys.argv[2]).exists() else 5)")
    a, b = tmp_path / "a", tmp_path / "b"
    run_children([[sys.executable, "-c", meet, str(a), str(b)], [sys.executable, "-c", meet, str(b), str(a)]], echo=False)
    pid_file, log = tmp_path / "sleeper.pid", tmp_path / "fail.log"
    fail = f"import pathlib, time\nwhile not pathlib.Path({str(pid_file)!r}).exists(): time.sleep(0.05)\nraise SystemExit(4)"
    with pytest.raises(ChildFailed, match="exited with status 4.*fail.log"):
        run_children([[sys.executable, "-c", SLEEPER, str(pid_file)], [sys.executable, "-c", fail]],
                     log_paths=[None, log], echo=False, grace_s=2)
    time.sleep(0.2)
    assert not _alive(int(pid_file.read_text()))
    with pytest.raises(ValueError, match="one log path"):
        run_children([["true"], ["true"]], log_paths=[None], echo=False)


def test_a_sharded_evaluation_writes_what_one_process_writes_and_resumes(tmp_path):
    """eval.workers=2: two evaluate.py processes on alternate questions, merged into the run's
    folder. The oracle (no model, deterministic) makes the rows comparable one for one with an
    unsharded run on the same world; the merged run's key is the unsharded run's, so either way of
    running reuses the other's predictions; a rerun computes nothing new."""
    from r3rag.pipeline import stages
    from r3rag.evaluation.predictions import load_rows

    def ctx_for(name: str, workers: int) -> Context:
        return _ctx(tmp_path / name, stages=["world", "index", "eval"], world={"size": "tiny", "clusters": 10, "questions_per_cluster": 6},
                    eval={"limit": 5, "base_methods": ["oracle"], "workers": workers, "set": ["run.progress=false"]},
                    report={"bootstrap": 100})

    runs = {}
    for name, workers in (("one", 1), ("two", 2)):
        ctx = ctx_for(name, workers)
        try:
            run_world(ctx)
            run_index(ctx)
            runs[name] = (ctx, stages.run_eval(ctx))
        finally:
            ctx.close()
    one, two = (runs[k][0].work / "eval" / "base-oracle" for k in ("one", "two"))
    shard_rows = [load_rows(two / "shards" / f"{i}-of-2" / "predictions.jsonl") for i in (0, 1)]
    assert [len(r) for r in shard_rows] == [3, 2]  # positions 0, 2, 4 and 1, 3
    assert {r["index"] for r in shard_rows[0]} == {0, 2, 4}
    keep = ("id", "index", "prediction", "scores", "num_retrievals")
    rows1, rows2 = ([{k: r.get(k) for k in keep} for r in load_rows(d / "predictions.jsonl")] for d in (one, two))
    assert len(rows1) == 5 and rows2 == rows1
    res1, res2 = (json.loads((d / "results.json").read_text()) for d in (one, two))
    assert res2["metrics"] == res1["metrics"] and res2["n"] == 5
    key1, key2 = (json.loads((d / "run.json").read_text())["config_key"] for d in (one, two))
    assert key2 == key1
    assert runs["two"][1]["runs"]["base-oracle"]["n"] == 5
    ctx = ctx_for("two", 2)
    try:
        again = stages.run_eval(ctx)
    finally:
        ctx.close()
    assert any("(0 new, 5 reused)" in line for line in ctx.lines)
    assert again["runs"]["base-oracle"]["metrics"] == res1["metrics"]


def test_eval_skip_evaluates_the_questions_after_the_first_ones_in_shards(tmp_path):
    """eval.skip=2 with two shard processes: the run holds positions 2..4 of the split (each row
    under its position in the world's file), the world stage's line says where they start, a skip
    past the end is a ConfigError, and skip 0 leaves the eval stage's fingerprint as it was."""
    from r3rag.evaluation.predictions import load_rows
    from r3rag.pipeline import stages

    world = {"size": "tiny", "clusters": 10, "questions_per_cluster": 6}
    ctx = _ctx(tmp_path / "w", stages=["world", "index", "eval"], world=world,
               eval={"skip": 2, "limit": 3, "base_methods": ["oracle"], "workers": 2, "set": ["run.progress=false"]},
               report={"bootstrap": 100})
    try:
        line = run_world(ctx)["line"]
        run_index(ctx)
        out = stages.run_eval(ctx)
    finally:
        ctx.close()
    assert line.endswith("3 held out for the evaluation (positions 3-5)")
    rows = load_rows(ctx.work / "eval" / "base-oracle" / "predictions.jsonl")
    split = [json.loads(x) for x in (ctx.work / "world" / "dev.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows] == [2, 3, 4] and len(split) > 5
    assert [r["id"] for r in rows] == [q["id"] for q in split[2:5]]
    assert out["runs"]["base-oracle"]["n"] == 3
    past = _ctx(tmp_path / "w", world=world, eval={"skip": len(split)})
    with pytest.raises(ConfigError, match=rf"eval\.skip={len(split)}: the world's dev split has only {len(split)} questions"):
        run_world(past)
    plain, zero = _ctx(tmp_path / "x", eval={"limit": 5}), _ctx(tmp_path / "y", eval={"limit": 5, "skip": 0})
    assert "skip" not in stages._eval_settings(plain) and stages._eval_settings(plain) == stages._eval_settings(zero)
    assert stages._eval_settings(ctx)["skip"] == 2


def test_a_stage_programs_long_lines_are_cut_on_the_console_not_in_its_log(tmp_path, capfd):
    """A program that prints a 5,000-character line (LLaMA-Factory's tokenised example) and a
    progress bar redrawn with carriage returns: the console shows the line's first
    CONSOLE_LINE_LIMIT characters and a marker naming the log, the bar's redraws whole; the log
    holds every byte."""
    from r3rag.pipeline.child import CONSOLE_LINE_LIMIT

    log = tmp_path / "stage.log"
    program = "print('x' * 5000); print('short'); print('\\r'.join(f'bar {i}' for i in range(3)))"
    run_child([sys.executable, "-c", program], log_path=log, echo=True)
    console = capfd.readouterr().out
    assert "x" * CONSOLE_LINE_LIMIT + f" ... [line cut; whole in {log}]" in console
    assert "x" * (CONSOLE_LINE_LIMIT + 1) not in console
    assert "short\n" in console and "bar 0\rbar 1\rbar 2" in console
    assert "x" * 5000 + "\n" in log.read_text()


# --- usability checks --------------------------------------------------------------------------------


def _fake_checkpoint(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"x")
    return d


def test_coldstart_with_nothing_kept_is_unusable(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"tried": 40, "kept": 0}))
    with pytest.raises(StageUnusable, match="kept 0 trajectories.*40 questions"):
        checks.check_coldstart(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"tried": 40, "kept": 12}))
    assert checks.check_coldstart(tmp_path, min_kept=10)["kept"] == 12


def test_sft_loss_must_fall(tmp_path):
    _fake_checkpoint(tmp_path)
    log = tmp_path / "trainer_log.jsonl"
    log.write_text("".join(json.dumps({"loss": x}) + "\n" for x in (2.0, 2.1, 2.2, 2.3)))
    with pytest.raises(StageUnusable, match="loss did not fall"):
        checks.check_sft(tmp_path)
    assert checks.check_sft(tmp_path, require_loss_drop=False)["loss_fell"] is False
    log.write_text("".join(json.dumps({"loss": x}) + "\n" for x in (2.0, 1.5, 1.2, 0.9)))
    out = checks.check_sft(tmp_path)
    assert out["loss_fell"] is True and out["checkpoint"] == str(tmp_path.resolve())


def test_rl_flat_and_fully_filtered_is_unusable(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "final")
    rows = [{"step": i, "kind": "train", "reward/total": 0.25, "batch/filtered_fraction": 1.0} for i in range(1, 5)]
    rows.insert(0, {"step": 0, "kind": "eval", "eval/em": 3.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(StageUnusable, match="reward stayed at 0.250.*every group"):
        checks.check_rl(tmp_path)
    rows[2]["batch/filtered_fraction"] = 0.5  # one iteration trained on something
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = checks.check_rl(tmp_path)
    assert out["checkpoint"] == str(ckpt.resolve()) and out["rewards"] == [0.25] * 4


def test_a_staged_rl_run_finds_its_last_final_folder(tmp_path):
    _fake_checkpoint(tmp_path / "stage1" / "final")
    time.sleep(0.01)
    last = _fake_checkpoint(tmp_path / "stage2" / "final")
    _fake_checkpoint(tmp_path / "stage2" / "checkpoints" / "step_3")
    assert checks.find_checkpoint(tmp_path) == last.resolve()


# --- paired bootstrap ----------------------------------------------------------------------------------


def _rows(em: np.ndarray, retrievals: np.ndarray | None = None, stop: list[str] | None = None) -> list[dict]:
    return [{"id": f"q{i}", "scores": {"em": float(v), "f1": float(v), "cover_em": float(v)},
             "num_retrievals": int(retrievals[i]) if retrievals is not None else 1,
             "stop_reason": stop[i] if stop else "answered"} for i, v in enumerate(em)]


def test_paired_differences_see_a_small_real_gain_that_separate_intervals_miss():
    rng = np.random.default_rng(1)
    a = (rng.random(300) < 0.4).astype(float)  # a model at about 40 EM
    b = a.copy()
    flip = rng.choice(np.flatnonzero(a == 0), size=24, replace=False)  # fixes 24 questions, breaks none: +8 EM
    b[flip] = 1.0
    d = paired_differences(_rows(a), _rows(b), resamples=2000, seed=0)["em"]
    assert d["diff"] == pytest.approx(8.0, abs=0.01)
    assert d["excludes_zero"] and d["ci95"][0] > 4.0
    ma, mb = means_with_ci(_rows(a), 2000, 0)["em"], means_with_ci(_rows(b), 2000, 0)["em"]
    assert mb["ci95"][0] < ma["ci95"][1]  # unpaired intervals overlap: only the paired test sees the gain
    noise = paired_differences(_rows(a), _rows(a[rng.permutation(300)]), resamples=2000, seed=0)["em"]
    assert noise["ci95"][0] < 0 < noise["ci95"][1] or abs(noise["diff"]) < 1e-9


def test_paired_differences_match_questions_by_id_and_columns_have_units():
    a = _rows(np.array([0, 1, 0, 1]), retrievals=np.array([1, 1, 1, 1]), stop=["format_error", "answered"] * 2)
    b = list(reversed(_rows(np.array([1, 1, 0, 1]), retrievals=np.array([2, 2, 3, 3]))))  # another order
    d = paired_differences(a, b, resamples=200)
    assert d["em"]["diff"] == pytest.approx(25.0) and d["em"]["n"] == 4
    assert d["retrievals"]["diff"] == pytest.approx(1.5)
    assert d["format_error"]["diff"] == pytest.approx(-50.0)
    m = means_with_ci(a, 200)
    assert m["format_error"]["mean"] == pytest.approx(50.0) and m["retrievals"]["ci95"] == [1.0, 1.0]
    with pytest.raises(Exception, match="share no question ids"):
        paired_differences(a, [dict(r, id="other" + r["id"]) for r in b])


# --- the report's choices --------------------------------------------------------------------------------


def test_a_claim_holds_only_when_the_paired_interval_is_above_zero():
    yes = checks.claim("rl_vs_sft", "RL", "SFT", {"diff": 6.0, "ci95": [1.2, 10.5], "n": 300}, goal=5.0)
    assert yes["holds"] is True and "RL beat SFT: yes (EM +6.0, paired 95% CI [+1.2, +10.5], n=300; goal +5 EM met)" == yes["text"]
    unsure = checks.claim("rl_vs_sft", "RL", "SFT", {"diff": 2.0, "ci95": [-0.5, 4.5], "n": 300}, goal=5.0)
    assert unsure["holds"] is False and "the interval includes zero" in unsure["text"] and "not met" in unsure["text"]
    worse = checks.claim("rl_vs_sft", "RL", "SFT", {"diff": -4.0, "ci95": [-7.0, -1.0], "n": 300})
    assert worse["holds"] is False and "it is worse" in worse["text"]
    assert checks.claim("x", "A", "B", None)["holds"] is None


def test_examples_prefer_questions_training_fixed_multi_hop_first():
    from r3rag.pipeline.report import choose_examples

    def row(i: int, em: float, hops: int) -> dict:
        return {"id": f"q{i}", "index": i, "scores": {"em": em}, "metadata": {"hops": hops}}

    before = [row(0, 0, 2), row(1, 1, 2), row(2, 0, 1), row(3, 0, 3), row(4, 0, 2)]
    after = [row(0, 0, 2), row(1, 1, 2), row(2, 1, 1), row(3, 1, 3), row(4, 1, 2)]
    picked = [b["id"] for b, _ in choose_examples(before, list(reversed(after)), 3)]
    assert picked == ["q3", "q4", "q2"]  # fixed and multi-hop (dataset order), then fixed single-hop


def test_eval_dtype_auto_follows_the_cpu(monkeypatch):
    from r3rag.pipeline import stages

    real_read = Path.read_text

    def fake_cpuinfo(flags: str):
        return lambda self, *a, **k: f"flags\t\t: fpu sse2 {flags}\n" if str(self) == "/proc/cpuinfo" else real_read(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", fake_cpuinfo("avx2 avx512f avx512_bf16"))
    assert stages.eval_dtype("auto") == "bfloat16"
    monkeypatch.setattr(Path, "read_text", fake_cpuinfo("avx2"))
    assert stages.eval_dtype("auto") == "float32"
    assert stages.eval_dtype("float32") == "float32" and stages.eval_dtype("bfloat16") == "bfloat16"


def test_a_missing_llamafactory_env_is_reported_before_anything_runs(tmp_path, monkeypatch):
    from r3rag.pipeline.stages import build_stages

    monkeypatch.setenv("R3RAG_LLAMAFACTORY_VENV", str(tmp_path / "no-such-venv"))
    ctx = _ctx(tmp_path, world={"size": "tiny", "clusters": 10, "questions_per_cluster": 2})
    with pytest.raises(ConfigError, match="needs LLaMA-Factory's environment at .*no-such-venv.*train/envs/llamafactory.sh"):
        run_pipeline(ctx, build_stages(ctx.cfg), ["world", "index", "coldstart", "sft"])
    assert not (ctx.work / "world").exists()  # nothing ran
    run_pipeline(ctx, build_stages(ctx.cfg), ["world"])  # stages that do not need it still run
    assert PipelineState(ctx.work).is_done("world")


def test_an_unfinished_llamafactory_env_is_reported_before_anything_runs(tmp_path, monkeypatch):
    """A quickstart started while train/envs/llamafactory.sh is still installing (python there,
    the CUDA torchvision not yet removed) once failed inside LLaMA-Factory a minute later."""
    from r3rag.pipeline.stages import build_stages
    from r3rag.pipeline.training import LLAMAFACTORY_STAMP

    venv = tmp_path / "half-built"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    monkeypatch.setenv("R3RAG_LLAMAFACTORY_VENV", str(venv))
    ctx = _ctx(tmp_path, world={"size": "tiny", "clusters": 10, "questions_per_cluster": 2})
    with pytest.raises(ConfigError, match=f"half-built is not finished .*{LLAMAFACTORY_STAMP} missing.*still being created"):
        run_pipeline(ctx, build_stages(ctx.cfg), ["world", "index", "coldstart", "sft"])
    assert not (ctx.work / "world").exists()
    (venv / LLAMAFACTORY_STAMP).write_text("created\n")
    from r3rag.pipeline.training import sft_preflight

    sft_preflight(ctx)  # finished: no error


def test_a_stage_resumed_after_a_failure_reports_its_time_over_both_runs(tmp_path):
    calls = {"n": 0}

    def flaky(ctx: Context) -> dict:
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.4)
            raise RuntimeError("the machine went away")
        return {"line": "ok"}

    stages = [Stage("a", "flaky", flaky)]
    ctx = _ctx(tmp_path)
    with pytest.raises(RuntimeError):
        run_pipeline(ctx, stages, ["a"])
    state = PipelineState(ctx.work)
    spent, attempts = state.spent("a", ctx.fingerprints["a"])
    assert spent >= 0.4 and attempts == 1  # the failed run's time is on disk
    assert state.spent("a", "another-fingerprint") == (0.0, 0)  # other settings: not this stage's time

    ctx2 = _ctx(tmp_path)
    run_pipeline(ctx2, stages, ["a"])
    marker = state.get("a")
    assert marker["elapsed_s"] >= 0.4 and marker["attempts"] == 2
    assert any("resuming:" in line and "1 earlier run(s)" in line for line in ctx2.lines)
    assert any("done in" in line and "in this run" in line for line in ctx2.lines)
    assert not state.clock_path("a").exists()  # the marker holds the total now


def test_the_stage_clock_is_on_disk_while_the_stage_runs(tmp_path):
    """What a SIGKILL leaves: the heartbeat has written the running stage's time so far."""
    from r3rag.pipeline.runner import StageClock

    state = PipelineState(tmp_path / "work")
    clock = StageClock(state, "sft", "fp", prior_s=10.0, attempt=2, interval_s=0.05)
    clock.__enter__()
    try:
        deadline = time.time() + 10
        while state.spent("sft", "fp")[0] < 10.1 and time.time() < deadline:
            time.sleep(0.05)
        spent, attempts = state.spent("sft", "fp")
        assert spent >= 10.1 and attempts == 2  # earlier runs' 10 s plus this one's, without __exit__
    finally:
        clock._stop.set()
        clock._thread.join()


def test_the_by_type_table_shows_a_yes_no_student_that_always_says_yes():
    """A student answering "yes" to every yes/no question scores the gold's share of "yes" there:
    the section says so beside the gold share; a type only one model has gets an empty cell."""
    from r3rag.pipeline.by_type import by_type_lines

    def row(t, gold, pred):
        em = float(gold == pred)
        return {"metadata": {"type": t}, "golden_answers": [gold], "prediction": pred,
                "scores": {"em": em, "f1": em, "cover_em": em, "acc": em}}

    golds = ["yes", "no", "no", "yes", "no"]
    always_yes = [row("yesno", g, "yes") for g in golds] + [row("single", "Ann", "Ann")]
    reads = [row("yesno", g, g) for g in golds] + [row("single", "Ann", "Bo"), row("bridge", "X", "X")]
    lines = by_type_lines({"SFT": always_yes, "RL": reads})
    table = {ln.split(" | ")[0].strip("| "): ln for ln in lines if ln.startswith("| ")}
    assert table["yesno (two-way)"] == "| yesno (two-way) | 5 | 40.0 (yes 100% / gold 40%) | 100.0 (yes 40% / gold 40%) |"
    assert table["single"] == "| single | 1 | 100.0 | 0.0 |"
    assert table["bridge"] == "| bridge | 1 |  | 100.0 |"
    # rows without a question type (a real benchmark's): no section at all
    assert by_type_lines({"SFT": [{"scores": {"em": 1.0, "f1": 1.0, "cover_em": 1.0, "acc": 1.0}, "metadata": {}}]}) == []

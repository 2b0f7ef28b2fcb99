"""A service that dies in the middle of an evaluation is never the model's answer.

Each test kills a real service while a run is going (the retrieval service, the OpenAI-compatible
model server, the LLM judge; or the HF backend fails as on an out-of-memory), then checks:

- the run ends with :class:`EvaluationIncomplete` (the CLI: exit 3 and one ``error:`` line)
  naming what failed and how many; nothing it failed for is in ``predictions.jsonl`` or scored;
  ``results.json`` counts them apart (``complete: false``, ``failed``);
- with the service back (a fresh one, on another port), a rerun into the same folder redoes
  exactly the questions that were not evaluated (failed, or left after the run stopped on the
  dead service), keeps every earlier prediction byte for byte, and ends with the same
  ``results.json`` and trajectories as a run that never saw a failure.

A service "dies" after serving ``n`` requests: the next one closes the server (``should_exit``)
and answers 500, so the client's retries then find the port closed, as after a crash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.responses import JSONResponse

from r3rag.config import load_config
from r3rag.evaluation.config import EvaluationConfig
from r3rag.evaluation.failures import FAILURES, EvaluationIncomplete, failure_of
from r3rag.evaluation.predictions import PREDICTIONS, load_rows
from r3rag.evaluation.runner import RESULTS, run_evaluation

REPO = Path(__file__).resolve().parents[1]
N = 6  # questions per run (world dev split)


# ---- services that die ----------------------------------------------------------------------------


class Dying:
    """Middleware state: serve ``after`` requests to ``path``, then shut the server down
    (``server``: the uvicorn server, set once it runs)."""

    def __init__(self, after: int | None) -> None:
        self.after, self.served, self.server = after, 0, None

    def install(self, app: Any, path: str) -> None:
        @app.middleware("http")
        async def die(request, call_next):  # type: ignore[no-untyped-def]
            if request.url.path.endswith(path) and self.after is not None:
                if self.served >= self.after:
                    if self.server is not None:
                        self.server.should_exit = True
                    return JSONResponse({"error": "killed"}, status_code=500)
                self.served += 1
            return await call_next(request)


def retrieval_service(index_dir: Path, die_after: int | None = None):
    from r3rag.retrieval.config import ServiceConfig
    from r3rag.retrieval.service import create_app, load_searchers, serve_app_in_thread

    cfg = ServiceConfig(microbatch=False, cache_size=0)
    app = create_app(load_searchers([index_dir], cfg), cfg)
    dying = Dying(die_after)
    dying.install(app, "/retrieve")
    handle = serve_app_in_thread(app)
    dying.server = handle.server
    return handle


def model_service(world: Path, fmt_name: str, die_after: int | None = None, hf_model: Path | None = None, port: int = 0):
    """An OpenAI-compatible server: the world's oracle writing ``fmt_name`` (a model that searches
    well), or a tiny HF model. The model's URL is part of a run's key, so a restarted server
    comes back on its ``port``."""
    from r3rag.data.readers import read_questions
    from r3rag.retrieval.service import serve_app_in_thread
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.oracle import OracleBackend
    from r3rag.testing.openai_standin import create_openai_app

    if hf_model is not None:
        from r3rag.rollout.backends.registry import get_backend

        backend = get_backend("hf", model=str(hf_model), dtype="float32", device="cpu")
    else:
        tok = load_tokenizer("tiny")
        questions = read_questions(world / "dev.jsonl")
        backend = OracleBackend(questions, get_format(fmt_name, mode="chat", tokenizer=tok), tok)
    app = create_openai_app(backend)
    dying = Dying(die_after)
    dying.install(app, "/completions")
    handle = serve_app_in_thread(app, port=port)
    dying.server = handle.server
    return handle


# ---- runs ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[Path, Path]:
    from r3rag.evaluation.components import prepare_world

    return prepare_world(tmp_path_factory.mktemp("eval-failures"))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from r3rag.testing.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def settings(world_dir: Path, method: str, retriever_url: str, model: str | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    sets = [f"dataset.world_dir={world_dir}", "dataset.name=world", "dataset.split=dev", f"dataset.limit={N}",
            f"method.name={method}", f"retriever.urls=[{retriever_url}]", "run.batch_size=1", "run.bootstrap=200",
            "run.progress=false", "method.answer_max_tokens=16"]
    if model is not None:
        sets.append(f"model.path={model}")
        if model.startswith("http"):
            sets += ["model.tokenizer=tiny"]
        else:  # a tiny random model: short turns keep it quick
            sets += ["rollout.max_turn_tokens=64"]
    return sets + list(extra)


def evaluate(sets: list[str], out: Path, config: str | None = None):
    return run_evaluation(load_config(EvaluationConfig, config, sets), out)


def ids(path: Path) -> list[str]:
    return [r["id"] for r in load_rows(path, repair=False)]


def check_consistent(out: Path) -> None:
    """No id twice in the predictions, none both predicted and failed, no failure scored."""
    preds, failed = ids(out / PREDICTIONS), ids(out / FAILURES)
    assert len(preds) == len(set(preds)) and len(failed) == len(set(failed))
    assert not set(preds) & set(failed)
    assert not any(failure_of(r) for r in load_rows(out / PREDICTIONS, repair=False))


def killed(tmp_path: Path, first: list[str], config: str | None = None, expect: str = "retrieval_failed") -> dict[str, Any]:
    """Run ``first`` (a service dies mid-run) into ``tmp_path/run``; check what it left."""
    out = tmp_path / "run"
    with pytest.raises(EvaluationIncomplete) as info:
        evaluate(first, out, config)
    outcome = info.value.outcome
    line = str(info.value)
    assert "\n" not in line and f"{expect} " in line and "rerun the same command" in line
    assert outcome.failed.get(expect, 0) >= 1 and not outcome.complete
    check_consistent(out)
    failed = ids(out / FAILURES)
    kept = ids(out / PREDICTIONS) if (out / PREDICTIONS).exists() else []
    assert len(kept) + len(failed) + outcome.not_attempted == N
    results = json.loads((out / RESULTS).read_text())
    assert results["complete"] is False and results["n"] == len(kept) and results["n_questions"] == N
    assert results["failed"] == outcome.failed and sum(results["failed"].values()) == len(failed)
    assert "INCOMPLETE" in (out / "report.md").read_text()
    before = (out / PREDICTIONS).read_bytes() if (out / PREDICTIONS).exists() else b""
    return {"out": out, "failed": failed, "kept": kept, "outcome": outcome, "results": results, "before": before, "line": line}


def rerun_equals_clean(tmp_path: Path, got: dict[str, Any], again: list[str], config: str | None = None) -> None:
    """Rerun with the services up: exactly the questions not evaluated are redone, earlier
    predictions stay byte for byte, and the result is a clean run's."""
    out, failed, kept = got["out"], got["failed"], got["kept"]
    resumed = evaluate(again, out, config)
    assert resumed.complete and (resumed.skipped, resumed.retried) == (len(kept), len(failed))
    assert resumed.new == N - len(kept)  # exactly the questions not evaluated before
    assert (out / PREDICTIONS).read_bytes().startswith(got["before"])  # earlier predictions untouched
    assert not (out / FAILURES).exists()
    check_consistent(out)
    redone = ids(out / PREDICTIONS)[len(kept):]
    assert set(failed) <= set(redone) and len(redone) == N - len(kept)

    clean = evaluate(again, tmp_path / "clean", config)
    assert clean.complete and clean.new == N
    assert (out / RESULTS).read_text() == (tmp_path / "clean" / RESULTS).read_text()
    ours = {r["id"]: r["trajectory"] for r in load_rows(out / PREDICTIONS)}
    theirs = {r["id"]: r["trajectory"] for r in load_rows(tmp_path / "clean" / PREDICTIONS)}
    assert ours == theirs


def killed_then_rerun(tmp_path: Path, first: list[str], again: list[str], config: str | None = None,
                      expect: str = "retrieval_failed") -> dict[str, Any]:
    got = killed(tmp_path, first, config, expect)
    rerun_equals_clean(tmp_path, got, again, config)
    return got


# ---- every method, every backend -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["oracle", "rag", "ircot"])
def test_the_retrieval_service_dies_mid_run(tmp_path, world, tiny_model, method):
    """oracle: the engine's step format with an in-process policy; rag/ircot: the prompted
    baselines with the HF backend (a tiny model)."""
    world_dir, index = world
    model = None if method == "oracle" else str(tiny_model)
    with retrieval_service(index, die_after=2) as dying:
        first = settings(world_dir, method, dying.url, model)
        with retrieval_service(index) as alive:
            got = killed_then_rerun(tmp_path, first, settings(world_dir, method, alive.url, model))
    assert got["outcome"].failed == {"retrieval_failed": len(got["failed"])}


@pytest.mark.parametrize("fmt", ["r3rag_steps", "r1searcher_tags"])
def test_the_model_server_dies_mid_run(tmp_path, world, fmt):
    """Both step formats through the OpenAI-compatible backend; the server (the oracle behind
    the stand-in, so every question searches) dies after a few completions and comes back on its
    port (the model's URL is part of the run's key)."""
    world_dir, index = world
    with retrieval_service(index) as retr:
        with model_service(world_dir, fmt, die_after=5) as dying:
            got = killed(tmp_path, settings(world_dir, fmt, retr.url, dying.url), expect="backend_error")
        with model_service(world_dir, fmt, port=dying.port) as alive:
            rerun_equals_clean(tmp_path, got, settings(world_dir, fmt, retr.url, alive.url))
    assert got["kept"]  # it did die in the middle


def test_the_retrieval_service_dies_under_a_step_format_through_a_model_server(tmp_path, world):
    world_dir, index = world
    with model_service(world_dir, "r1searcher_tags") as model, retrieval_service(index, die_after=4) as dying:
        first = settings(world_dir, "r1searcher_tags", dying.url, model.url)
        with retrieval_service(index) as alive:
            killed_then_rerun(tmp_path, first, settings(world_dir, "r1searcher_tags", alive.url, model.url))


def test_a_direct_answer_model_server_dies_mid_run(tmp_path, world, tiny_model):
    """The direct baseline (no retrieval) against a tiny HF model served over HTTP."""
    world_dir, index = world
    with model_service(world_dir, "r3rag_steps", die_after=2, hf_model=tiny_model) as dying:
        got = killed(tmp_path, settings(world_dir, "direct", "http://127.0.0.1:9", dying.url), expect="backend_error")
    with model_service(world_dir, "r3rag_steps", hf_model=tiny_model, port=dying.port) as alive:
        rerun_equals_clean(tmp_path, got, settings(world_dir, "direct", "http://127.0.0.1:9", alive.url))


def test_the_hf_backend_fails_mid_run_as_on_out_of_memory(tmp_path, world, tiny_model, monkeypatch):
    """The in-process HF backend fails from its third call on (as on an out-of-memory): the
    failed questions are counted apart; with the backend well again the rerun redoes them."""
    from r3rag.rollout.backends.hf import HFBackend

    world_dir, index = world
    calls = {"n": 0, "fail": True}
    real = HFBackend._generate_chunk

    def oom(self, reqs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["fail"] and calls["n"] > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(self, reqs)

    monkeypatch.setattr(HFBackend, "_generate_chunk", oom)
    with retrieval_service(index) as retr:
        sets = settings(world_dir, "rag", retr.url, str(tiny_model))
        got = killed(tmp_path, sets, expect="backend_error")
        assert "backend_error" in got["line"] and "(RuntimeError: CUDA out of memory" in got["line"]
        calls["fail"] = False
        rerun_equals_clean(tmp_path, got, sets)


def test_a_backend_that_raises_is_a_backend_error_not_a_wrong_answer(tmp_path, world, monkeypatch):
    """Any in-process backend whose generate raises (a vLLM engine that died) fails its questions:
    every one is counted apart, none scored, and the run stops after two dead batches."""
    from r3rag.evaluation import methods

    class Dead:
        tokenizer = None

        async def agenerate(self, requests):  # type: ignore[no-untyped-def]
            raise RuntimeError("vLLM engine is dead (EngineDeadError)")

    world_dir, index = world
    from r3rag.rollout.backends.hf_loading import load_tokenizer

    Dead.tokenizer = load_tokenizer("tiny")
    monkeypatch.setattr(methods, "load_backend", lambda cfg: Dead())
    with retrieval_service(index) as retr:
        with pytest.raises(EvaluationIncomplete) as info:
            evaluate(settings(world_dir, "r3rag_steps", retr.url, "some-model"), tmp_path / "run")
    o = info.value.outcome
    assert o.failed == {"backend_error": 2} and o.not_attempted == N - 2 and o.results["n"] == 0
    assert f"4 of {N}" not in str(info.value) and f"{N} of {N} questions not evaluated" in str(info.value)
    assert "EngineDeadError" in str(info.value) and "not attempted 4 after the failures above" in str(info.value)
    assert not (tmp_path / "run" / PREDICTIONS).exists() or not ids(tmp_path / "run" / PREDICTIONS)


# ---- the judge -------------------------------------------------------------------------------------


def test_the_judge_dies_mid_run_and_the_rerun_only_judges_again(tmp_path, world, monkeypatch):
    """With ``--judge``: a question whose judge call failed is not scored; the judge comes back on
    its port (its URL is part of the run's key) and the rerun asks it again for exactly those
    predictions, without generating them again."""
    from r3rag.evaluation import runner
    from r3rag.testing.standin_judge import StandinJudge

    world_dir, index = world

    def sets(url: str, retr: str, cache: str, *more: str) -> list[str]:
        return settings(world_dir, "oracle", retr, extra=(
            "run.judge=true", "judge.max_retries=1", "judge.backoff_s=0.01", "judge.timeout_s=5",
            f"judge.base_url={url}", f"judge.cache_path={tmp_path / cache}", *more))

    dying_judge = StandinJudge(mode="correct")
    dying = Dying(3)
    dying.install(dying_judge.app, "/chat/completions")
    with retrieval_service(index) as retr:
        with dying_judge:
            dying.server = dying_judge._server
            # every question is tried (no early stop), so the rerun has only judging left to do
            first = sets(dying_judge.base_url, retr.url, "c1.sqlite", "run.stop_after_failed_batches=0")
            got = killed(tmp_path, first, expect="judge_unavailable")
        assert "(judge " in got["line"]
        assert all("scores" in r and r["judge"] is None for r in load_rows(tmp_path / "run" / FAILURES))
        with StandinJudge(mode="correct", port=dying_judge.port) as judge:
            built: list[int] = []
            real_build = runner.build_method
            monkeypatch.setattr(runner, "build_method", lambda *a: built.append(1) or real_build(*a))
            rerun_equals_clean(tmp_path, got, sets(judge.base_url, retr.url, "c2.sqlite"))
            assert got["outcome"].not_attempted == 0 and built == [1]  # the clean run's: the rerun built no method
            assert judge.requests >= len(got["failed"])
    assert "judge_acc" in json.loads((tmp_path / "run" / RESULTS).read_text())["metrics"]


# ---- the command line, the shipped configuration, old folders, merge -------------------------------


def test_the_command_exits_3_with_one_line_and_the_rerun_retries(tmp_path, world):
    """`evaluate.py run --retriever-url` of a dead port: exit 3, one `error:` line naming
    retrieval_failed and the count, nothing scored; the same command with the service up redoes them."""
    world_dir, index = world
    cli = [sys.executable, str(REPO / "benchmark" / "evaluate.py"), "run", "--method", "oracle", "--no-progress",
           "--out", str(tmp_path / "run"), "--set", f"dataset.world_dir={world_dir}", "--limit", "3",
           "--set", "run.bootstrap=100"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    dead = subprocess.run(cli + ["--retriever-url", "http://127.0.0.1:9"], env=env, capture_output=True, text=True, timeout=240)
    assert dead.returncode == 3, dead.stderr
    errors = [x for x in dead.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "3 of 3 questions not evaluated" in errors[0] and "retrieval_failed 3 (" in errors[0]
    assert "0 new, 0 already done, 3 not evaluated" in dead.stdout
    assert json.loads((tmp_path / "run" / RESULTS).read_text())["failed"] == {"retrieval_failed": 3}
    with retrieval_service(index) as alive:
        up = subprocess.run(cli + ["--retriever-url", alive.url], env=env, capture_output=True, text=True, timeout=240)
    assert up.returncode == 0, up.stderr
    assert "3 new (3 retried after an earlier failure), 0 already done" in up.stdout
    assert len(ids(tmp_path / "run" / PREDICTIONS)) == 3 and not (tmp_path / "run" / FAILURES).exists()


def test_the_shipped_config_with_the_service_dying_inside_a_batch(tmp_path, world):
    """configs/evaluate/embedded-cpu.yaml as shipped (batch of 32, the client's retries and
    timeout, chat mode, its rollout budgets), the oracle as the policy: the service dies after
    two rounds of one batch, so some questions of the batch finished (2 hops) and the others
    failed; the rerun redoes exactly the failed ones."""
    world_dir, index = world
    config = str(REPO / "configs" / "evaluate" / "embedded-cpu.yaml")

    def sets(url: str) -> list[str]:
        return [f"dataset.world_dir={world_dir}", f"dataset.limit={N}", "method.name=oracle",
                f"retriever.urls=[{url}]", "run.progress=false"]

    with retrieval_service(index, die_after=2) as dying, retrieval_service(index) as alive:
        got = killed_then_rerun(tmp_path, sets(dying.url), sets(alive.url), config=config)
    assert got["kept"] and got["failed"] and got["outcome"].not_attempted == 0


def test_a_folder_an_older_version_scored_failures_in_is_repaired_and_retried(tmp_path, world):
    """Predictions written before failures were kept apart hold zeros for dead services: the next
    run moves them out of the predictions and retries them."""
    world_dir, index = world
    out = tmp_path / "run"
    with retrieval_service(index, die_after=1) as dying, retrieval_service(index) as alive:
        with pytest.raises(EvaluationIncomplete):
            evaluate(settings(world_dir, "oracle", dying.url, extra=("run.stop_after_failed_batches=0",)), out)
        # what an older version left: every row in predictions.jsonl, failed ones scored 0
        old = load_rows(out / PREDICTIONS) + [
            {**{k: v for k, v in r.items() if k not in ("failure", "error")}, "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0, "acc": 0.0}}
            for r in load_rows(out / FAILURES)]
        (out / PREDICTIONS).write_text("".join(json.dumps(r) + "\n" for r in old))
        (out / FAILURES).unlink()
        n_failed = sum(1 for r in old if failure_of(r))
        assert n_failed >= 1
        resumed = evaluate(settings(world_dir, "oracle", alive.url), out)
        assert resumed.complete and resumed.new == resumed.retried == n_failed
        check_consistent(out)
        clean = evaluate(settings(world_dir, "oracle", alive.url), tmp_path / "clean")
    assert clean.complete and (out / RESULTS).read_text() == (tmp_path / "clean" / RESULTS).read_text()


def test_merge_compare_and_paired_refuse_a_run_with_failures(tmp_path, world):
    from r3rag.errors import DataError
    from r3rag.evaluation.compare import load_results
    from r3rag.evaluation.merge import merge_runs
    from r3rag.evaluation.paired import run_rows

    world_dir, index = world
    with retrieval_service(index, die_after=1) as dying:
        for i in (0, 1):
            with pytest.raises(EvaluationIncomplete):
                evaluate(settings(world_dir, "oracle", dying.url, extra=(f"run.shard={i}/2",)), tmp_path / f"s{i}")
    with pytest.raises(DataError, match=r"questions not evaluated because a service failed \(retrieval_failed \d+\)"):
        merge_runs([tmp_path / "s0", tmp_path / "s1"], tmp_path / "merged")
    with pytest.raises(DataError, match="an incomplete run"):
        load_results(tmp_path / "s0")
    with pytest.raises(DataError, match="rerun that evaluation"):
        run_rows(str(tmp_path / "s0"))

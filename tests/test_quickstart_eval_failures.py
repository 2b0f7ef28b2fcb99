"""The quickstart's evaluation stage stops on a dead retrieval service instead of reporting it.

The pipeline runs world, index, eval and report with the shipped evaluation settings
(configs/evaluate/embedded-cpu.yaml, two shard processes as the fast and full presets run it) and
the world's oracle as the only method. Its retrieval service dies after serving a few searches
in the middle of the evaluation: the pipeline raises one error naming the run, what failed and
how many; the eval stage is not marked done and no report is written. Rerun (a fresh service),
the stage retries exactly the failed questions and the report's numbers equal a clean run's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from r3rag.evaluation.failures import FAILURES, EvaluationIncomplete
from r3rag.evaluation.predictions import PREDICTIONS, load_rows
from r3rag.pipeline.config import QuickstartConfig
from r3rag.pipeline.runner import Context, run_pipeline
from r3rag.pipeline.state import PipelineState

REPO = Path(__file__).resolve().parents[1]
STAGES = ["world", "index", "eval", "report"]


def _ctx(work: Path, workers: int) -> Context:
    cfg = QuickstartConfig(work=str(work), stages=STAGES, world={"size": "tiny", "clusters": 10, "questions_per_cluster": 6},
                           eval={"limit": 6, "base_methods": ["oracle"], "workers": workers, "set": ["run.progress=false"]},
                           report={"bootstrap": 100, "examples": 0})
    return Context(cfg=cfg, work=work, repo_root=REPO, echo=lambda line: None, echo_children=False)


def _dying_service(after: int):
    """``serve_in_thread`` whose service shuts down after ``after`` searches (500, then a closed port)."""
    from fastapi.responses import JSONResponse

    from r3rag.retrieval.config import ServiceConfig
    from r3rag.retrieval.service import create_app, load_searchers, serve_app_in_thread

    def serve(index_dirs, **opts):  # type: ignore[no-untyped-def]
        cfg = ServiceConfig(**{**opts, "cache_size": 0, "microbatch": False})
        app = create_app(load_searchers(list(index_dirs), cfg), cfg)
        state = {"served": 0, "handle": None}

        @app.middleware("http")
        async def die(request, call_next):  # type: ignore[no-untyped-def]
            if request.url.path.endswith("/retrieve"):
                if state["served"] >= after:
                    state["handle"].server.should_exit = True
                    return JSONResponse({"error": "killed"}, status_code=500)
                state["served"] += 1
            return await call_next(request)

        state["handle"] = serve_app_in_thread(app)
        return state["handle"]

    return serve


def _run(ctx: Context) -> dict:
    from r3rag.pipeline.stages import build_stages

    try:
        return run_pipeline(ctx, build_stages(ctx.cfg), STAGES)
    finally:
        ctx.close()


def test_a_dead_retrieval_service_stops_the_quickstart_and_the_rerun_retries(tmp_path, monkeypatch):
    import r3rag.retrieval.service as service

    work = tmp_path / "work"
    real = service.serve_in_thread
    monkeypatch.setattr(service, "serve_in_thread", _dying_service(after=2))
    with pytest.raises(EvaluationIncomplete) as info:
        _run(_ctx(work, workers=2))
    line = str(info.value)
    assert line.startswith("evaluation base-oracle (oracle) stopped, nothing reported: ")
    assert "questions not evaluated because a service failed: retrieval_failed " in line and "\n" not in line
    state = PipelineState(work)
    assert state.is_done("index", state.get("index")["fingerprint"]) and state.get("eval") is None
    assert not (work / "report").exists()
    shards = sorted((work / "eval" / "base-oracle" / "shards").glob("?-of-2"))
    failed = {r["id"] for d in shards for r in load_rows(d / FAILURES, repair=False)}
    kept = {r["id"] for d in shards for r in load_rows(d / PREDICTIONS, repair=False)}
    assert failed and not failed & kept

    monkeypatch.setattr(service, "serve_in_thread", real)  # the service is back
    out = _run(_ctx(work, workers=2))
    summary = out["eval"]["summary"]["runs"]["base-oracle"]
    rows = load_rows(work / "eval" / "base-oracle" / PREDICTIONS)
    assert len(rows) == summary["n"] == 6 and {r["id"] for r in rows} >= failed | kept
    assert not any((d / FAILURES).exists() for d in shards)

    clean = _run(_ctx(tmp_path / "clean", workers=1))
    assert clean["eval"]["summary"]["runs"]["base-oracle"]["metrics"] == summary["metrics"]
    table = (work / "report" / "table.csv").read_text()
    assert table == (tmp_path / "clean" / "report" / "table.csv").read_text()
    assert json.loads((work / "eval" / "base-oracle" / "results.json").read_text())["n"] == 6

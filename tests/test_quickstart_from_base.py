"""The from-base quickstart (``--preset from-base``): RL from the prompted base, no cold start.

- RL starts from ``model.base`` (not an SFT folder) with ``rl.start: base``; the default still
  starts from SFT with the same fingerprint as before the option existed;
- a chain that never answers breaks R3-RAG's format only with ``require_answer`` (the rule the
  preset's rewards and report use);
- the report's figures (format-valid rate, retrievals by hop count, EM, paired) and claims,
  on hand-made rows where the answer is known: a rate that did not double fails the claim;
- the shipped preset: base and RL evaluated in the format, prompt and budgets RL trains in;
- end to end at a tiny scale, with the stand-in RL program and with the real ``train/rl.py`` running
  the shipped two-stage config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from r3rag.config import load_config
from r3rag.errors import ConfigError
from r3rag.pipeline import training
from r3rag.pipeline.config import QuickstartConfig
from r3rag.pipeline.report_from_base import claims, compare, format_valid, pick_runs
from r3rag.pipeline.runner import Context
from r3rag.pipeline.stages import build_stages
from r3rag.rewards.format import FormatConfig, format_violations
from r3rag.rollout.trajectory import Step, Trajectory

REPO = Path(__file__).resolve().parents[1]
PRESET = REPO / "configs" / "quickstart" / "from-base.yaml"
STANDINS = REPO / "tests" / "quickstart_standins"

VALID_QUERY = "Step 1:\nThe problem analysis: I need X.\nThe retrieval query: X"
VALID_ANSWER = "Step 2:\nThe problem analysis: X is Y.\nThe final answer: Y"
BROKEN = "The final answer: Y\nThe final answer: Z"


def traj(*raws: str) -> Trajectory:
    steps = []
    for i, raw in enumerate(raws):
        answer = raw.rsplit("The final answer: ", 1)[1] if "The final answer: " in raw else None
        query = raw.rsplit("The retrieval query: ", 1)[1] if answer is None and "The retrieval query: " in raw else None
        steps.append(Step(i, query=query, answer=answer, raw=raw, retrieved=query is not None))
    return Trajectory("q", "?", "r3rag_steps", steps=steps)


def row(i: int, *, valid: bool, em: float = 0.0, retrievals: int = 1, hops: int = 2) -> dict:
    """A prediction row: a format-valid answered chain, or one that ended in a format error."""
    t = traj(VALID_QUERY, VALID_ANSWER) if valid else traj(BROKEN)
    return {"id": f"q{i}", "index": i, "scores": {"em": em, "f1": em, "cover_em": em}, "num_retrievals": retrievals,
            "stop_reason": "answered" if valid else "format_error", "metadata": {"hops": hops},
            "trajectory": t.to_dict(), "prediction": "Y", "question": "?", "golden_answers": ["Y"]}


# --- the format rule -----------------------------------------------------------------------------


def test_a_chain_that_never_answers_breaks_the_format_only_when_an_answer_is_required():
    queries_only = traj(VALID_QUERY, VALID_QUERY.replace("Step 1", "Step 2"))
    assert format_violations(queries_only, FormatConfig()) == []  # R3-RAG's own rules: unchanged
    assert [v.name for v in format_violations(queries_only, FormatConfig(require_answer=True))] == ["no_answer"]
    assert format_violations(traj(VALID_QUERY, VALID_ANSWER), FormatConfig(require_answer=True)) == []


def test_format_valid_needs_an_answer_and_no_broken_rule():
    assert format_valid(row(0, valid=True)) == 1.0
    assert format_valid(row(0, valid=False)) == 0.0
    answered_but_broken = dict(row(0, valid=True), trajectory=traj(VALID_QUERY, BROKEN).to_dict())
    answered_but_broken["stop_reason"] = "answered"
    assert format_valid(answered_but_broken) == 0.0
    ran_out = dict(row(0, valid=True), stop_reason="max_steps", trajectory=traj(VALID_QUERY).to_dict())
    assert format_valid(ran_out) == 0.0


def test_a_method_without_a_step_format_is_a_clear_error():
    rag = dict(row(0, valid=True), trajectory=dict(traj(VALID_ANSWER).to_dict(), format_name="rag"))
    with pytest.raises(ConfigError, match="needs runs in a step format"):
        format_valid(rag)


# --- the figures and the claims ------------------------------------------------------------------


def test_format_valid_doubled_with_the_interval_above_zero_holds():
    base = [row(i, valid=i < 10) for i in range(100)]                    # 10%
    rl = [row(i, valid=i < 30, retrievals=2) for i in range(100)]        # 30%: x3, 20 questions gained, none lost
    c = compare(base, rl, resamples=500)
    fv = c["metrics"]["format_valid"]
    assert (fv["base"]["mean"], fv["rl"]["mean"], fv["diff"]["diff"]) == (10.0, 30.0, 20.0)
    assert fv["diff"]["ci95"][0] > 0 and c["format_ratio"] == pytest.approx(3.0)
    assert c["metrics"]["retrievals"]["diff"]["diff"] == 1.0
    got = {x["name"]: x for x in claims(c)}
    assert got["format_valid_doubled"]["holds"] is True and got["format_valid_doubled"]["required"] is True
    assert got["em_up"]["holds"] is False and got["em_up"]["required"] is False  # EM did not move: the moonshot fails


def test_a_rate_that_rose_but_did_not_double_fails_the_claim():
    base = [row(i, valid=i < 20) for i in range(100)]   # 20%
    rl = [row(i, valid=i < 35) for i in range(100)]     # 35%: up by 15 with the interval above zero, but x1.75
    c = compare(base, rl, resamples=500)
    assert c["metrics"]["format_valid"]["diff"]["ci95"][0] > 0
    claim = claims(c)[0]
    assert claim["holds"] is False and "less than x2" in claim["text"]


def test_a_doubling_on_too_few_questions_fails_the_claim():
    base = [row(i, valid=i == 0) for i in range(10)]                     # 1 of 10
    rl = [row(i, valid=i in (0, 5)) for i in range(10)]                  # 2 of 10: doubled, on one question
    claim = claims(compare(base, rl, resamples=500))[0]
    assert claim["holds"] is False and "interval includes zero" in claim["text"]


def test_from_none_to_some_is_a_doubling_when_the_interval_clears_zero():
    base = [row(i, valid=False) for i in range(60)]
    rl = [row(i, valid=i % 2 == 0) for i in range(60)]
    c = compare(base, rl, resamples=500)
    claim = claims(c)[0]
    assert c["format_ratio"] == float("inf") and claim["holds"] is True and "from none" in claim["text"]
    none = claims(compare(base, base, resamples=200))[0]
    assert none["holds"] is False and "n/a" in none["text"]


def test_retrievals_by_hop_count_and_em_are_paired_per_question():
    base = [row(i, valid=True, em=0.0, retrievals=1, hops=1 + i % 3) for i in range(90)]
    rl = [row(i, valid=True, em=1.0 if i < 45 else 0.0, retrievals=(1 + i % 3), hops=1 + i % 3) for i in range(90)]
    c = compare(base, rl, resamples=500)
    assert sorted(c["by_hops"]) == [1, 2, 3]
    assert [c["by_hops"][h]["rl"]["mean"] for h in (1, 2, 3)] == [1.0, 2.0, 3.0]
    assert [c["by_hops"][h]["diff"]["diff"] for h in (1, 2, 3)] == [0.0, 1.0, 2.0]
    assert c["by_hops"][3]["diff"]["ci95"] == [2.0, 2.0] and c["by_hops"][2]["n"] == 30
    em = c["metrics"]["em"]["diff"]
    assert em["diff"] == 50.0 and em["ci95"][0] > 0
    assert claims(c)[1]["holds"] is True


def test_a_policy_that_stops_searching_fails_the_search_claim_whatever_its_em():
    """Format and EM up by answering at once: the search claim says so; a policy that searches as
    often as the base (or more) keeps it. Worked out: base 1 retrieval per question, RL 0 on all 50
    questions -> difference -1.00 with a degenerate interval [-1, -1]."""
    base = [row(i, valid=i < 5, em=0.0, retrievals=1) for i in range(50)]
    stopped = [row(i, valid=i < 25, em=1.0 if i < 10 else 0.0, retrievals=0) for i in range(50)]
    got = {x["name"]: x for x in claims(compare(base, stopped, resamples=300))}
    assert got["format_valid_doubled"]["holds"] and got["em_up"]["holds"]
    search = got["still_searches"]
    assert search["holds"] is False and search["required"] is False
    assert search["diff"] == -1.0 and search["ci95"] == [-1.0, -1.0]
    assert "stopped calling the search tool" in search["text"] and "1.00 -> 0.00" in search["text"]
    fewer = [row(i, valid=True, retrievals=i % 2) for i in range(50)]           # 0.5 per question
    assert "fewer searches" in {x["name"]: x for x in claims(compare(base, fewer, resamples=300))}["still_searches"]["text"]
    more = [row(i, valid=True, retrievals=2) for i in range(50)]
    assert {x["name"]: x for x in claims(compare(base, more, resamples=300))}["still_searches"]["holds"] is True


def test_the_base_is_the_run_in_the_trained_format():
    runs = {"base-rag": {"role": "base", "method": "rag"}, "base-r3rag_steps": {"role": "base", "method": "r3rag_steps"},
            "rl": {"role": "rl", "method": "r3rag_steps"}}
    assert pick_runs(runs, "r3rag_steps") == ("base-r3rag_steps", "rl")
    with pytest.raises(ConfigError, match="add r3rag_steps to eval.base_methods"):
        pick_runs({k: v for k, v in runs.items() if k != "base-r3rag_steps"}, "r3rag_steps")


# --- where RL starts -----------------------------------------------------------------------------


def _ctx(tmp_path: Path, cfg: QuickstartConfig) -> Context:
    return Context(cfg=cfg, work=tmp_path / "work", repo_root=REPO, echo=lambda _: None, echo_children=False)


def test_rl_starts_from_the_base_model_and_needs_no_sft(tmp_path, monkeypatch):
    seen: list[list[str]] = []
    monkeypatch.setattr(training, "_run_stage_program", lambda ctx, name, section, wiring: seen.append(wiring) or tmp_path)
    monkeypatch.setattr(training.checks, "check_rl", lambda *a, **k: {})
    monkeypatch.setattr("r3rag.pipeline.stages.retrieval_url", lambda ctx: "http://127.0.0.1:1")
    monkeypatch.setattr("r3rag.pipeline.stages.checkpoint_of", lambda ctx, stage: f"/ckpt/{stage}")
    base = QuickstartConfig.model_validate({"model": {"base": "/models/base"}, "rl": {"start": "base"}})
    sft = QuickstartConfig.model_validate({"model": {"base": "/models/base"}, "eval": {"null_control": False}})
    training.run_rl(_ctx(tmp_path, base))
    training.run_rl(_ctx(tmp_path, sft))
    assert "model.path=/models/base" in seen[0] and "model.path=/ckpt/sft" in seen[1]
    rl_stage = {s.name: s for s in build_stages(base)}["rl"]
    assert rl_stage.needs == ("world", "index") and rl_stage.title == "RL from the prompted base"
    assert {s.name: s for s in build_stages(sft)}["rl"].needs == ("sft", "index")
    # the default's settings are what they were before the option existed (finished folders stay finished);
    # starting from the base is another fingerprint, and so is another base model
    assert "start" not in training.rl_settings(_ctx(tmp_path, sft))["rl"]
    assert training.rl_settings(_ctx(tmp_path, base)) != training.rl_settings(_ctx(tmp_path, sft))
    other = QuickstartConfig.model_validate({"model": {"base": "/models/other"}, "rl": {"start": "base"}})
    assert training.rl_settings(_ctx(tmp_path, other)) != training.rl_settings(_ctx(tmp_path, base))


# --- the shipped preset --------------------------------------------------------------------------


def test_the_shipped_preset_evaluates_base_and_rl_as_rl_trains():
    """The base and the RL model answer in the format and prompt RL trains in, under the same
    rollout budgets; RL starts from the base with no cold start; the report is the from-base one."""
    from r3rag.train.rl.config import RLConfig

    cfg = load_config(QuickstartConfig, PRESET, [])
    assert cfg.stages == ["world", "index", "rl", "eval", "report"] and cfg.rl.start == "base"
    assert cfg.report.kind == "from_base" and cfg.eval.skip == 300 and cfg.eval.limit == 300
    rl = load_config(RLConfig, REPO / cfg.rl.config, []).check()
    assert cfg.eval.base_methods == [cfg.eval.trained_method] == [rl.rollout.format]
    assert cfg.eval.base_prompt_variant == cfg.eval.trained_prompt_variant == rl.rollout.prompt_variant
    # one rollout profile: the preset's (every evaluation run gets it) is the one RL trains under
    from r3rag.rollout.profile import load_profile

    profile = load_profile(REPO / cfg.profile)
    for key in ("max_steps", "max_turn_tokens", "doc_max_chars", "max_new_tokens", "max_total_tokens"):
        assert getattr(profile, key) == getattr(rl.rollout, key), key
    assert cfg.profile == rl.rollout.profile
    from r3rag.evaluation.config import EvaluationConfig

    ev = load_config(EvaluationConfig, REPO / cfg.eval.config, [*cfg.eval.set, f"rollout.profile={REPO / cfg.profile}",
                                                                 *profile.overrides("rollout")])
    assert ev.rollout.mode == rl.rollout.mode and ev.rollout.docs_per_step == rl.rollout.docs_per_step
    # R1-Searcher's two stages, 5 + 10 minutes, each paying a format-valid answer (require_answer)
    stages = [load_config(RLConfig, REPO / cfg.rl.config, list(s.set)).check() for s in rl.stages]
    assert [s.reward.recipe for s in stages] == ["r1searcher_stage1", "r1searcher_stage2"]
    assert [s.train.max_minutes for s in stages] == [5, 10]
    assert all("format.require_answer=true" in s.reward.overrides for s in stages)
    assert not rl.train.eval_at_start and not rl.train.eval_at_end


def test_the_shipped_rewards_pay_a_valid_answer_over_a_chain_that_never_answers():
    """Stage 1: searched and answered validly 1.0, searched but never answered 0.5 (the format is
    broken), as R1-Searcher's tag rules score a generation without <answer>; stage 2: F1 of the
    answer, and the format penalty (-2) for the chain that never answered."""
    from r3rag.rewards.recipes import load_recipe
    from r3rag.train.rl.config import RLConfig

    rl = load_config(RLConfig, REPO / "configs/rl/world_base_two_stage.yaml", [])
    good, never = traj(VALID_QUERY, VALID_ANSWER), traj(VALID_QUERY, VALID_QUERY.replace("Step 1", "Step 2"))
    good.golden_answers = never.golden_answers = ["Y"]
    totals = {}
    for stage in rl.stages:
        cfg = load_config(RLConfig, REPO / "configs/rl/world_base_two_stage.yaml", list(stage.set))
        scorer = load_recipe(cfg.reward.recipe, cfg.reward.overrides, recipe_dir=REPO / "configs" / "rewards")
        totals[stage.name] = [o.total for o in scorer.score([good, never])]
    assert totals == {"stage1": [1.0, 0.5], "stage2": [1.0, -2.0]}


# --- end to end at a tiny scale ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from r3rag.testing.tiny_models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("fb") / "tiny")


def quickstart(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "r3rag.quickstart", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


def tiny_sets(tmp_path: Path, model: Path) -> list[str]:
    """The shipped preset at a tiny scale: a tiny world and model, 4 held-out questions."""
    return ["--work", str(tmp_path / "work"), "--set", f"model.base={model}", "--set", "world.size=tiny",
            "--set", "world.clusters=10", "--set", "world.questions_per_cluster=4", "--set", "eval.skip=0",
            "--set", "eval.limit=4", "--set", "eval.workers=1", "--set", "eval.batch_size=4", "--set", "report.bootstrap=200"]


@pytest.mark.slow
def test_the_preset_runs_end_to_end_with_rl_started_from_the_base(tmp_path, tiny_model):
    """Stand-in RL program: world -> index -> RL (from model.base, no SFT folder anywhere) -> the
    base and the RL model on the same questions -> the from-base report and its claims; a random
    model never writes a valid answer, so the format claim fails and --require-claims exits 4."""
    work = tmp_path / "work"
    r = quickstart("--preset", "from-base", *tiny_sets(tmp_path, tiny_model), "--set", f"rl.script={STANDINS / 'rl.py'}",
                   "--set", "rl.config=null")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    for i, s in enumerate(["world", "index", "rl", "eval", "report"], 1):
        assert f"[{i}/5] {s}" in r.stdout
    assert "RL from the prompted base" in r.stdout
    assert not (work / "sft").exists() and not (work / "coldstart").exists()
    assert "path: " + str(tiny_model) in (work / "rl" / "config.yaml").read_text()  # what the RL program started from
    runs = {d.name: json.loads((d / "results.json").read_text()) for d in (work / "eval").iterdir()}
    assert set(runs) == {"base-r3rag_steps", "rl"}
    assert runs["rl"]["model"] == str((work / "rl" / "final").resolve())
    md = (work / "report" / "quickstart.md").read_text()
    for needle in ("# r3rag quickstart: RL from the prompted base (from-base preset)",
                   "| format-valid answers % |", "| EM |", "| retrievals/q |", "RL - base (paired)",
                   "Retrievals per question by the question's hop count", "Format-valid answers at least doubled",
                   "EM up after RL from the prompted base (the moonshot)", "## The RL stages", "## The quickstart's tables"):
        assert needle in md, needle
    fb = json.loads((work / "report" / "from_base.json").read_text())
    assert fb["n"] == 4 and fb["base_run"] == "base-r3rag_steps" and fb["by_hops"]
    assert set(fb["metrics"]["format_valid"]["diff"]) == {"diff", "ci95", "excludes_zero", "n"}
    found = {c["name"]: c for c in json.loads((work / "report" / "claims.json").read_text())}
    assert found["format_valid_doubled"]["holds"] is False and found["em_up"]["required"] is False
    assert found["still_searches"]["required"] is False and "RL still searches as much as the prompted base" in md
    assert "Format-valid answers at least doubled by RL from the prompted base: no" in r.stdout
    again = quickstart("--preset", "from-base", *tiny_sets(tmp_path, tiny_model), "--set",
                       f"rl.script={STANDINS / 'rl.py'}", "--set", "rl.config=null", "--require-claims")
    assert again.returncode == 4 and again.stdout.count("skip: done earlier") == 4


@pytest.mark.slow
def test_the_shipped_two_stage_rl_config_runs_from_the_base(tmp_path, tiny_model):
    """The real train/rl.py with the preset's own RL config (stage 1, then stage 2 from stage 1's
    final model), one iteration each, from the tiny base; the report reads both stages."""
    work = tmp_path / "work"
    rl_set = ("rl.set=[train.iterations=1, train.questions_per_iter=2, rollout.n_samples=2, model.threads=1, "
              "rollout.max_new_tokens=48, rollout.max_turn_tokens=16, train.tensorboard=false]")
    r = quickstart("--preset", "from-base", *tiny_sets(tmp_path, tiny_model), "--set", rl_set,
                   "--set", "eval.set=[run.progress=false, rollout.max_new_tokens=48, rollout.max_turn_tokens=16]")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for stage in ("stage1", "stage2"):
        assert (work / "rl" / stage / "final" / "config.json").is_file(), stage
    cfg1 = (work / "rl" / "stage1" / "config.yaml").read_text()
    assert f"path: {tiny_model}" in cfg1 and "r1searcher_stage1" in cfg1
    assert f"path: {work / 'rl' / 'stage1' / 'final'}" in (work / "rl" / "stage2" / "config.yaml").read_text()
    rl = json.loads((work / "eval" / "rl" / "results.json").read_text())
    assert rl["model"] == str((work / "rl" / "stage2" / "final").resolve())
    md = (work / "report" / "quickstart.md").read_text()
    assert "- stage1: 1 iterations" in md and "- stage2: 1 iterations" in md

"""One rollout profile for every stage: cold start, SFT's cutoff, RL and the evaluation of trained
models read the same budgets, so a chain SFT trains on is one the RL policy can sample and no
chain is cut; the teacher's own turns fit what RL can sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from r3rag.config import load_config
from r3rag.errors import ConfigError
from r3rag.evaluation.config import EvaluationConfig
from r3rag.rollout.config import RolloutConfig
from r3rag.rollout.profile import PROFILE_KEYS, SFT_END_ROOM, load_profile
from r3rag.train.coldstart.config import ColdStartConfig
from r3rag.train.rl.config import RLConfig
from r3rag.train.sft.config import SFTConfig

ROOT = Path(__file__).resolve().parents[1]
WORLD_PROFILE = "configs/rollout/world-smollm2.yaml"
#: the shipped configs of the world pipeline and the section holding their rollout budgets
WORLD_CONFIGS = {
    "configs/coldstart/world-oracle.yaml": (ColdStartConfig, "rollout"),
    "configs/rl/world_sft_grpo.yaml": (RLConfig, "rollout"),
    "configs/rl/world_sft_rft.yaml": (RLConfig, "rollout"),
    "configs/evaluate/embedded-cpu.yaml": (EvaluationConfig, "rollout"),
}


def _budgets(rollout: RolloutConfig) -> dict:
    return {k: getattr(rollout, k) for k in PROFILE_KEYS}


def test_a_profile_fills_only_the_keys_a_section_leaves_unset(tmp_path):
    prof = tmp_path / "p.yaml"
    prof.write_text("max_steps: 3\ndocs_per_step: 2\nmax_turn_tokens: 40\nmax_new_tokens: 100\nmax_total_tokens: 900\n")
    r = load_config(RolloutConfig, None, [f"profile={prof}", "max_turn_tokens=16"])
    assert (r.max_steps, r.docs_per_step, r.max_new_tokens, r.max_total_tokens) == (3, 2, 100, 900)
    assert r.max_turn_tokens == 16  # an explicit key (a test's --set) still wins
    assert r.doc_max_chars is None  # the profile's own default, not the section's 512
    assert load_config(RolloutConfig, None, []).max_turn_tokens == 256  # no profile: the section's defaults
    with pytest.raises(ConfigError, match="rollout profile .*missing.yaml: file not found"):
        load_config(RolloutConfig, None, [f"profile={tmp_path / 'missing.yaml'}"])
    prof.write_text("max_steps: 3\n")
    with pytest.raises(ConfigError, match="docs_per_step: Field required"):
        load_config(RolloutConfig, None, [f"profile={prof}"])


def test_the_sft_cutoff_follows_the_profile_unless_set():
    p = load_profile(WORLD_PROFILE)
    assert load_config(SFTConfig, None, [f"rollout_profile={WORLD_PROFILE}"]).data.cutoff_len == p.max_total_tokens + SFT_END_ROOM
    assert load_config(SFTConfig, None, [f"rollout_profile={WORLD_PROFILE}", "data.cutoff_len=1024"]).data.cutoff_len == 1024
    assert load_config(SFTConfig, None, []).data.cutoff_len == 4096


def test_shipped_world_configs_share_one_profile_and_repeat_none_of_its_keys():
    profile = load_profile(WORLD_PROFILE).model_dump()
    for path, (cls, section) in WORLD_CONFIGS.items():
        raw = yaml.safe_load((ROOT / path).read_text())[section]
        assert raw.get("profile") == WORLD_PROFILE, path
        assert not set(raw) & set(PROFILE_KEYS), f"{path} sets {set(raw) & set(PROFILE_KEYS)} beside its profile"
        assert _budgets(getattr(load_config(cls, ROOT / path), section)) == profile, path
    sft = load_config(SFTConfig, ROOT / "configs/sft/world-smollm2-cpu.yaml")
    assert sft.rollout_profile == WORLD_PROFILE
    assert "cutoff_len" not in yaml.safe_load((ROOT / "configs/sft/world-smollm2-cpu.yaml").read_text())["data"]
    assert sft.data.cutoff_len == load_profile(WORLD_PROFILE).sft_cutoff_len()


@pytest.mark.parametrize("preset", ["full", "fast"])
def test_every_quickstart_stage_runs_under_the_presets_profile(preset, tmp_path, monkeypatch):
    """The wiring the pipeline gives each stage program, loaded as that program loads it: cold
    start, RL and both evaluations (base and trained) get the profile's budgets, SFT its cutoff."""
    from r3rag.pipeline import checks, stages, training
    from r3rag.pipeline.config import QuickstartConfig
    from r3rag.pipeline.runner import Context
    from r3rag.pipeline.state import PipelineState

    cfg = load_config(QuickstartConfig, ROOT / f"configs/quickstart/{preset}.yaml", [f"work={tmp_path}", "eval.null_control=false"])
    ctx = Context(cfg=cfg, work=tmp_path, repo_root=ROOT, echo=lambda line: None, echo_children=False)
    profile = load_profile(ROOT / cfg.profile)
    assert cfg.profile == WORLD_PROFILE
    seen: dict[str, list[str]] = {}

    def capture(ctx, name, section, wiring):
        seen[name] = training._program(ctx, section, tmp_path / name, wiring)
        return tmp_path / name

    monkeypatch.setattr(training, "_run_stage_program", capture)
    monkeypatch.setattr(stages, "retrieval_url", lambda ctx: "http://127.0.0.1:1", raising=False)
    for name in ("check_coldstart", "check_sft", "check_rl"):
        monkeypatch.setattr(checks, name, lambda *a, **k: {})
    (tmp_path / "sft" / "final").mkdir(parents=True)
    (tmp_path / "sft" / "final" / "config.json").write_text("{}")
    PipelineState(tmp_path).mark_done("sft", "fp", {"checkpoint": str(tmp_path / "sft" / "final")}, 1.0)
    training.run_coldstart(ctx)
    training.run_sft(ctx)
    training.run_rl(ctx)

    def load(cls, cmd):
        sets = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]
        return load_config(cls, cmd[cmd.index("--config") + 1], sets)

    assert _budgets(load(ColdStartConfig, seen["coldstart"]).rollout) == profile.model_dump()
    assert _budgets(load(RLConfig, seen["rl"]).rollout) == profile.model_dump()
    assert load(SFTConfig, seen["sft"]).data.cutoff_len == profile.sft_cutoff_len()
    runs = stages.eval_runs(ctx)
    assert {r["role"] for r in runs} >= {"base", "sft", "rl"}
    for run in runs:
        ecfg = load_config(EvaluationConfig, ROOT / cfg.eval.config, [*run["overrides"], *cfg.eval.set])
        assert _budgets(ecfg.rollout) == profile.model_dump(), run["name"]


@pytest.mark.slow
def test_no_teacher_turn_is_longer_than_rl_can_sample(tmp_path):
    """The shipped cold start (world oracle, its variety, SmolLM2's tokenizer) on 1-4 hop questions
    with its budgets lifted, so that the teacher writes its turns in full: every turn, every chain's
    generated total and every chain fit each shipped RL config of the step format, and at the
    shipped budgets the same chains are kept (the budget cut no teacher chain)."""
    from r3rag.train.coldstart.builder import build_coldstart
    from r3rag.train.coldstart.store import read_rows
    from tests.sft_helpers import make_world

    world, index = make_world(tmp_path, size="small")
    qs = [json.loads(x) for x in (world / "train.jsonl").read_text().splitlines()]
    picked = [q for h in (1, 2, 3, 4) for q in [q for q in qs if q["metadata"]["hops"] == h][:12]]
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(q) + "\n" for q in picked))
    base = [f"data.questions={tmp_path / 'q.jsonl'}", f"retriever.index_dir={index}", "output.progress=false",
            "attempts.max_attempts=2"]
    lifted = ["rollout.max_turn_tokens=4096", "rollout.max_new_tokens=16384", "rollout.max_total_tokens=32768"]
    runs = {}
    for name, extra in (("lifted", lifted), ("shipped", [])):
        cfg = load_config(ColdStartConfig, ROOT / "configs/coldstart/world-oracle.yaml",
                          [*base, *extra, f"output.dir={tmp_path / name}"])
        build_coldstart(cfg)
        runs[name] = read_rows(tmp_path / name, "trajectories")
    trajs = runs["lifted"]
    assert {t["metadata"]["hops"] for t in trajs} == {1, 2, 3, 4}
    turns = [len(s["token_ids"]) for t in trajs for s in t["segments"] if s["role"] == "model"]
    generated = [sum(len(s["token_ids"]) for s in t["segments"] if s["role"] == "model") for t in trajs]
    chains = [sum(len(s["token_ids"]) for s in t["segments"]) for t in trajs]
    rl_configs = sorted((ROOT / "configs/rl").glob("*.yaml"))
    checked = 0
    for path in rl_configs:
        r = load_config(RLConfig, path).rollout
        if r.format != "r3rag_steps":
            continue  # no cold start writes its format's chains
        if r.prompt_variant == "fewshot":
            continue  # RL from the prompted base (the worked-example prompt): it never trains on teacher chains
        checked += 1
        assert max(turns) <= r.max_turn_tokens, f"{path.name}: a teacher turn of {max(turns)} tokens, RL samples {r.max_turn_tokens}"
        assert max(generated) <= r.max_new_tokens, f"{path.name}: a teacher chain generates {max(generated)}, RL {r.max_new_tokens}"
        assert max(chains) <= r.max_total_tokens, f"{path.name}: a teacher chain of {max(chains)} tokens, RL {r.max_total_tokens}"
    assert checked >= 3
    assert [t["question_id"] for t in runs["shipped"]] == [t["question_id"] for t in trajs]
    assert [t["segments"] for t in runs["shipped"]] == [t["segments"] for t in trajs]

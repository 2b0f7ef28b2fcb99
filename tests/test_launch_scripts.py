"""The cluster launch scripts (train/scripts/*.sh): every flag of every script is accepted by the
installed OpenRLHF's own argument parser and validation, with the published hyper-parameters.

The scripts print their flags instead of starting anything with ``R3RAG_DRY_RUN=1``. Parsing
needs OpenRLHF (.venvs/openrlhf): skipped when it is absent, a failure with R3RAG_REQUIRE_ENVS=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from openrlhf_env import run_in_openrlhf
from r3rag.train.openrlhf.config import load_agent_config
from r3rag.train.openrlhf.launch import HOOK, merge_runtime_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "train" / "scripts"
RECIPES = ["r3rag_ppo_llama3.1-8b", "r3rag_ppo_qwen2.5-7b", "r1searcher_llama3.1-8b", "r1searcher_qwen2.5-7b"]


def dry_run(script: str, **env: str) -> list[tuple[dict[str, str], list[str]]]:
    """[(plugin env, argv)] for each OpenRLHF run the script would start (R1-Searcher: two)."""
    proc = subprocess.run(["bash", str(SCRIPTS / f"{script}.sh")], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, R3RAG_DRY_RUN="1", **env))
    assert proc.returncode == 0, proc.stderr
    runs: list[tuple[dict[str, str], list[str]]] = []
    for line in proc.stdout.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "ENV":
            key, _, value = rest.partition("=")
            if key == "R3RAG_AGENT_CONFIG":
                runs.append(({}, []))
            runs[-1][0][key] = value
        elif kind == "ARG":
            runs[-1][1].append(rest)
    return runs


@pytest.fixture(scope="module")
def runs():
    out = {}
    for script in RECIPES:
        for nodes in ("1", "2"):
            for i, (env, argv) in enumerate(dry_run(script, NNODES=nodes)):
                out[f"{script}/nodes{nodes}/run{i + 1}"] = (env, argv)
    return out


@pytest.fixture(scope="module")
def parsed(runs, tmp_path_factory):
    flag_sets = {name: argv for name, (_, argv) in runs.items()}
    # the control: a flag OpenRLHF renamed or never had must be caught
    control = list(runs["r3rag_ppo_llama3.1-8b/nodes1/run1"][1])
    control[control.index("--actor.adam.lr")] = "--actor.learning_rate"
    flag_sets["control/renamed"] = control
    path = tmp_path_factory.mktemp("flags") / "flags.json"
    path.write_text(json.dumps(flag_sets))
    return run_in_openrlhf("flags", str(path))


def test_scripts_are_valid_bash():
    for script in SCRIPTS.glob("*.sh"):
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, (script.name, proc.stderr)


def test_every_flag_is_accepted_by_openrlhf(parsed):
    runs_ = {k: v for k, v in parsed.items() if not k.startswith(("control/", "_"))}
    bad = {k: v["error"] for k, v in runs_.items() if not v["ok"]}
    assert not bad
    assert len(runs_) == 12  # 2 PPO + 2x2 R1 runs, 1 and 2 nodes
    assert parsed["control/renamed"]["ok"] is False and "--actor.learning_rate" in parsed["control/renamed"]["error"]


def test_launcher_runs_openrlhfs_own_main(parsed):
    """The scripts' entry point (python -m r3rag.train.openrlhf.launch) is OpenRLHF's main with the hook."""
    assert parsed["_launcher_help"] == {"exit": 0, "has_agent_flag": True, "hook": True}


def test_prompts_file_for_openrlhf(tmp_path):
    src = tmp_path / "r1.jsonl"
    src.write_text('{"idx": 3, "question": "Who wrote it?", "answer": "Ann", "pred_anses": ["x"]}\n'
                   '{"id": "w1", "question": "Where?", "golden_answers": ["Quessa"], "metadata": {"supporting_ids": ["p2"]}}\n')
    out = tmp_path / "prompts.jsonl"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "openrlhf_prompts.py"), "--dataset", str(src), "--out", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question"] for r in rows] == ["Who wrote it?", "Where?"]
    labels = [json.loads(r["label"]) for r in rows]
    assert labels[0] == {"id": "3", "golden_answers": ["Ann"], "metadata": {}}
    assert labels[1]["metadata"] == {"supporting_ids": ["p2"]}
    from r3rag.train.openrlhf.rollout import parse_label

    q = parse_label(rows[1]["question"], rows[1]["label"])
    assert (q.id, q.golden_answers, q.metadata["supporting_ids"]) == ("w1", ["Quessa"], ["p2"])
    bad = subprocess.run([sys.executable, str(SCRIPTS / "openrlhf_prompts.py"), "--dataset", str(tmp_path / "nope.jsonl"),
                          "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_r3rag_ppo_hyper_parameters(parsed, runs):
    for family in ("llama3.1-8b", "qwen2.5-7b"):
        a = parsed[f"r3rag_ppo_{family}/nodes1/run1"]
        assert a["algo.advantage.estimator"] == "gae" and a["critic.model_name_or_path"] == "/path/to/sft-checkpoint"
        assert (a["actor.adam.lr"], a["critic.adam.lr"], a["algo.kl.init_coef"]) == (5e-7, 9e-6, 0.01)
        assert (a["rollout.batch_size"], a["rollout.n_samples_per_prompt"]) == (64, 4)
        assert a["train.agent_func_path"].endswith("r3rag/train/openrlhf/agent.py")
        assert (a["data.input_key"], a["data.label_key"], a["data.apply_chat_template"]) == ("question", "label", False)
        two = parsed[f"r3rag_ppo_{family}/nodes2/run1"]
        assert (two["actor.num_nodes"], two["vllm.num_engines"]) == (2, 16)
        env = runs[f"r3rag_ppo_{family}/nodes1/run1"][0]
        cfg = load_agent_config(env)
        assert (cfg.rollout.max_steps, cfg.rollout.docs_per_step, cfg.rollout.max_docs_per_trajectory) == (5, 2, 10)
        assert cfg.reward.recipe == "r3rag" and cfg.agent.per_step_rewards is True


def test_r1searcher_hyper_parameters(parsed, runs):
    for family, kl, penalty in (("llama3.1-8b", 1e-4, -1.0), ("qwen2.5-7b", 0.0, -2.0)):
        for stage in (1, 2):
            name = f"r1searcher_{family}/nodes1/run{stage}"
            a = parsed[name]
            assert a["algo.advantage.estimator"] == "reinforce_baseline" and a["critic.model_name_or_path"] is None
            assert (a["actor.adam.lr"], a["algo.kl.init_coef"], a["rollout.temperature"]) == (2e-6, kl, 1.0)
            assert a["rollout.n_samples_per_prompt"] == 16
            cfg = load_agent_config(runs[name][0])
            assert (cfg.rollout.format, cfg.rollout.docs_per_step, cfg.rollout.max_steps) == ("r1searcher_tags", 3, 9)
            assert cfg.reward.recipe == f"r1searcher_stage{stage}"
            if stage == 2:
                assert cfg.reward.overrides == [f"outcome.format_penalty={int(penalty)}"]
        # stage 2 starts from stage 1's model
        stage1_out = runs[f"r1searcher_{family}/nodes1/run1"][1]
        stage2_policy = runs[f"r1searcher_{family}/nodes1/run2"][1]
        out_dir = stage1_out[stage1_out.index("--ckpt.output_dir") + 1]
        assert stage2_policy[stage2_policy.index("--actor.model_name_or_path") + 1] == out_dir


def test_bad_settings_are_one_line_errors():
    for env in ({"MODEL_FAMILY": "gpt"}, {"NNODES": "0"}, {"STAGE": "3"}):
        proc = subprocess.run(["bash", str(SCRIPTS / "r1searcher.sh")], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, R3RAG_DRY_RUN="1", **env))
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "error" in proc.stderr, (env, proc.stderr)
    proc = subprocess.run(["bash", str(SCRIPTS / "r3rag_ppo.sh")], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k not in ("POLICY", "R3RAG_DRY_RUN")})
    assert proc.returncode == 2 and "POLICY" in proc.stderr
    proc = subprocess.run(["bash", str(SCRIPTS / "cluster_node.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr


def test_launcher_adds_the_hook_and_our_variables_to_rays_runtime_env(monkeypatch):
    for key in [k for k in os.environ if k.startswith("R3RAG_")]:  # e.g. CI's R3RAG_REQUIRE_ENVS
        monkeypatch.delenv(key)
    monkeypatch.setenv("R3RAG_AGENT_CONFIG", "r3rag_ppo")
    monkeypatch.setenv("R3RAG_RETRIEVER_URLS", "http://n1:8100")
    env = merge_runtime_env({"env_vars": {"NCCL_DEBUG": "WARN"}})
    assert env["worker_process_setup_hook"] == HOOK
    assert env["env_vars"] == {"NCCL_DEBUG": "WARN", "R3RAG_AGENT_CONFIG": "r3rag_ppo", "R3RAG_RETRIEVER_URLS": "http://n1:8100"}
    assert "worker_process_setup_hook" not in merge_runtime_env(None, per_step=False)
    with pytest.raises(RuntimeError, match="already set"):
        merge_runtime_env({"worker_process_setup_hook": "other.hook"})

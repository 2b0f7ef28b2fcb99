"""Checks that need OpenRLHF itself; run by the tests inside .venvs/openrlhf (one process per group).

``python tests/openrlhf_checks.py stock``  prints one JSON object with the results of the
executor-through-OpenRLHF and per-step-placement checks; ``... flags FILE`` parses every flag set
in FILE (JSON: {name: [argv...]}) with OpenRLHF's own parser and prints what the tests assert on.
The assertions themselves live in the tests; this file only measures.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

torch.set_num_threads(1)


def flags(path: str) -> dict:
    from r3rag.train.openrlhf.flags import FlagError, get, parse_with_openrlhf

    keys = ["algo.advantage.estimator", "actor.adam.lr", "critic.adam.lr", "algo.kl.init_coef", "algo.kl.use_loss",
            "rollout.batch_size", "rollout.n_samples_per_prompt", "rollout.temperature", "critic.model_name_or_path",
            "train.agent_func_path", "data.input_key", "data.label_key", "data.apply_chat_template",
            "actor.num_nodes", "actor.num_gpus_per_node", "vllm.num_engines", "data.max_len", "reward.remote_url"]
    out = {}
    for name, argv in json.loads(Path(path).read_text()).items():
        try:
            args = parse_with_openrlhf(argv)
            out[name] = {"ok": True, **{k: _plain(get(args, k)) for k in keys}}
        except FlagError as err:
            out[name] = {"ok": False, "error": str(err)}
    out["_launcher_help"] = launcher_help()
    return out


def launcher_help() -> dict:
    """``python -m r3rag.train.openrlhf.launch --help`` reaches OpenRLHF's own parser (and installs the hook)."""
    import contextlib
    import io

    from r3rag.train.openrlhf import launch, per_step

    buf = io.StringIO()
    code = None
    with contextlib.redirect_stdout(buf):
        try:
            launch.main(["--help"])
        except SystemExit as exc:
            code = exc.code
    return {"exit": code, "has_agent_flag": "--train.agent_func_path" in buf.getvalue(), "hook": per_step.installed()}


def _plain(v):
    return v if isinstance(v, (int, float, str, bool, type(None), list)) else str(v)


def _serve(corpus):
    from openrlhf_helpers import SlowRetrieve

    class Fast(SlowRetrieve):
        delay = 0.0
    Fast.corpus = corpus

    server = ThreadingHTTPServer(("127.0.0.1", 0), Fast)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stock() -> dict:
    from openrlhf.trainer.ppo_utils import experience_maker, samples_generator
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import AgentExecutorBase

    from openrlhf_helpers import StandinEngine, StandinSamplingParams, turn_script
    from rollout_helpers import CORPUS, QUESTIONS, tiny_tokenizer
    from openrlhf_helpers import DOCS, steps_script
    from r3rag.rewards.recipes import load_recipe
    from r3rag.rollout.trajectory import Trajectory
    from r3rag.train.openrlhf import per_step
    from r3rag.train.openrlhf.data import prompt_row
    from r3rag.train.openrlhf.flags import parse_with_openrlhf
    from r3rag.train.rl.batch import build_batch

    res: dict = {"check_targets": per_step.check_targets()}
    tok = tiny_tokenizer()
    server = _serve(CORPUS)
    cfg_file = Path(tempfile.mkdtemp()) / "agent.yaml"
    cfg_file.write_text("rollout:\n  format: r3rag_steps\n  docs_per_step: 2\n  max_total_tokens: 2048\nreward:\n  recipe: r3rag\n"
                        "agent:\n  return_trajectory: true\n")
    os.environ.update(R3RAG_AGENT_CONFIG=str(cfg_file), R3RAG_RETRIEVER_URLS=f"http://127.0.0.1:{server.server_address[1]}")

    # 1. OpenRLHF's own loader builds our AgentExecutor with no arguments
    agent_file = str(Path(per_step.__file__).with_name("agent.py"))
    executor = _load_agent_executor(agent_file)
    res["is_agent_executor"] = isinstance(executor, AgentExecutorBase)

    engine = StandinEngine(tok, turn_script(steps_script(tok.eos_token), DOCS))
    script_q = QUESTIONS[0]

    async def sample(q, n):
        row = prompt_row(q)
        return [await executor.execute(row["question"], row["label"], StandinSamplingParams(logprobs=1), 2048, tok, engine)
                for _ in range(n)]

    responses = asyncio.run(sample(script_q, 4))
    # one sample of the group had its retrieval fail (the trainer contract: dropped, not penalised)
    dropped = dict(responses[2])
    dropped.update(action_ranges=[], reward=0.0, r3rag_step_rewards=[], r3rag_dropped=True)
    responses[2] = dropped
    server.shutdown()

    # 2. OpenRLHF's own conversion of our responses into Experiences (stock, then with the hook)
    SG = samples_generator.SamplesGenerator
    stock_exp = SG._process_response_into_experience(None, responses[0], max_len=2048)
    res["installed_first"] = per_step.install()
    res["installed_again"] = per_step.install()
    exps = [SG._process_response_into_experience(None, r, max_len=2048) for r in responses]
    traj = Trajectory.from_dict(responses[0]["r3rag_trajectory"])
    reward = load_recipe("r3rag").score([traj])[0]
    single = build_batch([traj], [reward], pad_id=tok.pad_token_id)
    res["action_mask_equals_trainer"] = stock_exp.action_mask[0].tolist() == [int(x) for x in single.action_mask[0].tolist()]
    res["dense_equals_trainer"] = torch.allclose(exps[0].info[per_step.STEP_KEY][0], single.step_rewards[0])
    res["n_step_rewards"] = int((exps[0].info[per_step.STEP_KEY][0] != 0).sum())

    # 3. OpenRLHF's own advantage code with the hook: GAE (R3-RAG) and reinforce_baseline (R1-Searcher)
    def maker(estimator, gamma="1.0", lambd="1.0", n=4):
        argv = ["--actor.model_name_or_path", "x", "--train.agent_func_path", agent_file, "--algo.advantage.estimator",
                estimator, "--rollout.n_samples_per_prompt", str(n), "--algo.advantage.gamma", gamma,
                "--algo.advantage.lambd", lambd, "--rollout.batch_size", "1", "--train.batch_size", "4",
                "--actor.num_gpus_per_node", "1", "--rollout.micro_batch_size", "1"]
        args = parse_with_openrlhf(argv)
        m = object.__new__(experience_maker.RemoteExperienceMaker)
        m.strategy, m.args, m.advantage_estimator = SimpleNamespace(args=args), args, estimator
        m.kl_ctl = SimpleNamespace(value=0.0)
        return m

    def prepared(batch):
        out = []
        for i, e in enumerate(batch):
            e = SG._process_response_into_experience(None, responses[i], max_len=2048)
            e.index = [i]
            e.kl = torch.zeros_like(e.action_mask, dtype=torch.float32)
            e.values = torch.zeros_like(e.action_mask, dtype=torch.float32)
            out.append(e)
        return out

    gae = maker("gae").compute_advantages_and_returns(prepared(exps))
    mask = single.action_mask[0]
    expected = torch.flip(torch.cumsum(torch.flip(single.step_rewards[0] * mask, [0]), 0), [0]) * mask
    res["gae_returns_equal_trainer_placement"] = torch.allclose(gae[0].returns[0] * mask, expected, atol=1e-5)
    res["gae_return_at_first_action"] = float(gae[0].returns[0][mask.bool()][0])
    res["gae_return_at_last_action"] = float(gae[0].returns[0][mask.bool()][-1])
    res["info_cleaned"] = all(per_step.STEP_KEY not in e.info for e in gae)
    res["dropped_has_no_actions"] = int(gae[2].action_mask.sum())

    rb = maker("reinforce_baseline").compute_advantages_and_returns(prepared(exps))
    kept = [r["reward"] for i, r in enumerate(responses) if i != 2]
    res["group_mean_kept"] = sum(kept) / len(kept)
    res["rb_returns_first_action"] = [float(e.returns[0][e.action_mask[0].bool()][0]) if e.action_mask.sum() else None for e in rb]
    res["rb_rewards"] = [r["reward"] for r in responses]
    res["rb_step_rewards"] = [r.get("r3rag_step_rewards") for r in responses]

    # 4. the hook off for an experience without step rewards: stock OpenRLHF placement, bit for bit
    stock_only = prepared(exps)
    for e in stock_only:
        e.info.pop(per_step.STEP_KEY, None)
    st = maker("gae").compute_advantages_and_returns(stock_only)
    res["stock_return_first_equals_last"] = abs(float(st[0].returns[0][mask.bool()][0]) - float(st[0].returns[0][mask.bool()][-1])) < 1e-6
    res["stock_return_first"] = float(st[0].returns[0][mask.bool()][0])
    res["ray_worker"] = ray_hook()
    return res


def ray_hook() -> list:
    """Through the launcher's ray.init wrapper, a fresh Ray worker has the hook and our variables."""
    import ray

    from r3rag.train.openrlhf.launch import wrap_ray_init

    os.environ["R3RAG_AGENT_SET"] = "rollout.max_steps=4"
    wrap_ray_init(True)
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR", runtime_env={"env_vars": {"OPENRLHF_OWN": "1"}})
    try:
        @ray.remote
        def probe():
            from r3rag.train.openrlhf.per_step import installed

            return [installed(), os.environ.get("R3RAG_AGENT_SET"), os.environ.get("OPENRLHF_OWN"), os.getpid()]

        return ray.get(probe.remote(), timeout=240) + [os.getpid()]
    finally:
        ray.shutdown()


if __name__ == "__main__":
    what = sys.argv[1]
    result = stock() if what == "stock" else flags(sys.argv[2])
    print("R3RAG-RESULT " + json.dumps(result))

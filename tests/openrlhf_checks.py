"""Checks that need OpenRLHF itself; run by the tests inside .venvs/openrlhf (one process per group).

``python tests/openrlhf_checks.py stock``  prints one JSON object with the results of the
executor-through-OpenRLHF and per-step-placement checks; ``... flags FILE`` parses every flag set
in FILE (JSON: {name: [argv...]}) with OpenRLHF's own parser and prints what the tests assert on;
``... parity`` compares the single-machine estimators with OpenRLHF's own advantage code, stock and
with the hook, over every shipped recipe and every estimator OpenRLHF's parser offers (see
:func:`parity`). The assertions themselves live in the tests; this file only measures. The r3rag
imported is the one on ``PYTHONPATH`` (the checkout under test).
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
    # the shipped R3-RAG discounting (gamma 1.0, lambd 0.95) on a real episode with documents
    # between its steps: OpenRLHF + hook = the single-machine trainer, at every action token
    from r3rag.train.rl.estimators import compute_advantages

    shipped = maker("gae", lambd="0.95").compute_advantages_and_returns(prepared(exps))
    ours = compute_advantages("gae", single.step_rewards, single.action_mask, torch.zeros(1, dtype=torch.long),
                              values=torch.zeros_like(single.action_mask), gamma=1.0, lambd=0.95)
    res["gae_shipped_returns_equal_trainer"] = torch.allclose(shipped[0].returns[0] * mask, ours.returns[0], atol=1e-5)
    res["episode_has_documents_between_steps"] = bool((mask.diff() == 1).sum() >= 2)
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


# ---------------------------------------------------------------------------------------------------
# parity: single machine vs OpenRLHF (stock, and with the per-step hook)

#: the settings (columns) of the parity table: (name, per-step rewards, document tokens, dropped, kind)
SETTINGS = (
    ("outcome", False, 0, False, "plain"),
    ("steps, docs 5", True, 5, False, "plain"),
    ("steps, docs 50", True, 50, False, "plain"),
    ("steps, docs 300", True, 300, False, "plain"),
    ("steps, docs 50, dropped", True, 50, True, "plain"),
    ("steps, equal totals", True, 50, False, "equal"),
    ("outcome > 10", False, 0, False, "large"),
)
N_GROUPS = 3


def _rows(g: torch.Generator, n: int, steps: bool, doc: int, dropped: bool, kind: str) -> list[dict]:
    """Samples (prompt, model turns with documents between them), each a dict of python lists."""
    rows = []
    for b in range(N_GROUPS * n):
        grp, k = divmod(b, n)
        n_steps = 1 + int(torch.randint(0, 3, (1,), generator=g)) if steps else 1
        lens = [int(torch.randint(2, 6, (1,), generator=g)) for _ in range(n_steps)]
        if kind == "equal" and grp < 2 and steps:  # equal (group 0) or nearly equal (group 1) totals, split apart
            n_steps, lens = 2, [3, 4]
            first = [0.6, 1.4, 0.2, 1.0][k % 4]
            rewards = [first, 2.0 - first + (3e-7 * k if grp == 1 else 0.0)]
        elif steps:
            rewards = [round(float(torch.rand(1, generator=g)) * 1.6, 3) for _ in range(n_steps - 1)]
            rewards.append(2.0 * float(torch.rand(1, generator=g) > 0.5) - 0.9 * float(torch.rand(1, generator=g) > 0.8))
        else:
            rewards = [round(float(torch.randn(1, generator=g)), 3)]
            if kind == "large" and k == 0:
                rewards = [12.0]
        rows.append({"group": grp, "lens": lens, "rewards": rewards, "drop": dropped and k == 1 and grp < 2,
                     "prompt": int(torch.randint(1, 4, (1,), generator=g)), "doc": doc})
    return rows


def _tensors(rows: list[dict], g: torch.Generator) -> dict:
    spans = []
    for r in rows:
        pos, mine = r["prompt"], []
        for i, n_tok in enumerate(r["lens"]):
            mine.append((pos, pos + n_tok))
            pos += n_tok + (r["doc"] if i < len(r["lens"]) - 1 else 0)
        spans.append(mine)
    L = max(s[-1][1] for s in spans) + 1
    B = len(rows)
    mask, steps = torch.zeros(B, L), torch.zeros(B, L)
    for b, (r, sp) in enumerate(zip(rows, spans)):
        if r["drop"]:
            continue  # a dropped sample: no action token (OpenRLHF), not in the batch (one machine)
        for (a, e), rew in zip(sp, r["rewards"]):
            mask[b, a:e] = 1
            steps[b, e - 1] += rew
    return {"mask": mask, "steps": steps, "totals": torch.tensor([0.0 if r["drop"] else sum(r["rewards"]) for r in rows]),
            "drop": torch.tensor([r["drop"] for r in rows]), "group": torch.tensor([r["group"] for r in rows]),
            "kl": torch.randn(B, L, generator=g) * 0.05 * mask, "values": torch.randn(B, L, generator=g) * mask,
            "perm": torch.randperm(B, generator=g)}


def _flags():
    """This checkout's r3rag/train/openrlhf/flags.py (it imports no r3rag), also when PYTHONPATH's
    r3rag is another checkout being measured (benchmark/rl_openrlhf_parity.py --before)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("r3rag_parity_flags", HERE.parent / "r3rag" / "train" / "openrlhf" / "flags.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def parity_cases() -> list[dict]:
    """Every shipped recipe's (estimator, gamma, lambd, reward clip, KL in the reward, samples per
    prompt) from configs/rl/*.yaml, and every estimator OpenRLHF's own parser offers at the R3-RAG
    recipe's gamma/lambd."""
    from r3rag.config import load_config
    from r3rag.train.rl.config import RLConfig

    import r3rag

    cases = []
    for path in sorted((Path(r3rag.__file__).resolve().parents[1] / "configs" / "rl").glob("*.yaml")):
        a = load_config(RLConfig, path, []).algo
        n = load_config(RLConfig, path, []).rollout.n_samples
        cases.append({"name": path.stem, "estimator": a.estimator, "gamma": a.gamma, "lambd": a.lambd,
                      "clip": list(a.reward_clip) if a.reward_clip else None,
                      "kl_coef": 0.0 if a.kl_use_loss else a.kl_coef, "n": n})
    flags = _flags()
    ppo = next(c for c in cases if c["estimator"] == "gae")
    for est in flags.option(flags.openrlhf_parser(), "--algo.advantage.estimator").choices:
        cases.append({"name": f"openrlhf {est}", "estimator": est, "gamma": ppo["gamma"], "lambd": ppo["lambd"],
                      "clip": ppo["clip"], "kl_coef": ppo["kl_coef"], "n": 4})
    return cases


def _openrlhf_maker(case: dict):
    from openrlhf.trainer.ppo_utils import experience_maker

    parse_with_openrlhf = _flags().parse_with_openrlhf
    agent_file = str(HERE.parent / "r3rag" / "train" / "openrlhf" / "agent.py")
    argv = ["--actor.model_name_or_path", "x", "--train.agent_func_path", agent_file, "--algo.advantage.estimator",
            case["estimator"], "--rollout.n_samples_per_prompt", str(case["n"]), "--algo.advantage.gamma", str(case["gamma"]),
            "--algo.advantage.lambd", str(case["lambd"]), "--rollout.batch_size", "1", "--train.batch_size", str(case["n"]),
            "--actor.num_gpus_per_node", "1", "--rollout.micro_batch_size", "1"]
    args = parse_with_openrlhf(argv)
    m = object.__new__(experience_maker.RemoteExperienceMaker)
    m.strategy, m.args, m.advantage_estimator = SimpleNamespace(args=args), args, case["estimator"]
    m.kl_ctl = SimpleNamespace(value=case["kl_coef"])
    return m


def _openrlhf_run(case: dict, d: dict, hook: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """OpenRLHF's compute_advantages_and_returns on two shuffled micro-batches of the samples."""
    from r3rag.train.openrlhf import per_step

    maker = _openrlhf_maker(case)
    B = d["mask"].size(0)
    exps = []
    for part in (d["perm"][: B // 2], d["perm"][B // 2:]):
        ix = part.clone()
        info = {}
        if hook:
            info[per_step.STEP_KEY] = d["steps"][ix].clone()
            info[per_step.DROP_KEY] = d["drop"][ix].float()
        exps.append(SimpleNamespace(index=ix.tolist(), rewards=d["totals"][ix].clone(), kl=d["kl"][ix].clone(),
                                    action_mask=d["mask"][ix].clone(), values=d["values"][ix].clone(), info=info,
                                    response_length=d["mask"][ix].sum(-1)))
    exps = maker.compute_advantages_and_returns(exps)
    adv, ret = torch.zeros_like(d["kl"]), torch.zeros_like(d["kl"])
    for e in exps:
        ix = torch.tensor(e.index)
        adv[ix], ret[ix] = e.advantages.float(), e.returns.float()
    return adv, ret


def _single_run(case: dict, d: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    from r3rag.train.rl.estimators import compute_advantages

    keep = ~d["drop"]
    try:
        out = compute_advantages(case["estimator"], d["steps"][keep], d["mask"][keep], d["group"][keep], kl=d["kl"][keep],
                                 kl_coef=case["kl_coef"], values=d["values"][keep] if case["estimator"] == "gae" else None,
                                 gamma=case["gamma"], lambd=case["lambd"],
                                 reward_clip=tuple(case["clip"]) if case["clip"] else None)
    except ValueError:  # an estimator this checkout's single machine does not have
        return None
    adv, ret = torch.zeros_like(d["kl"]), torch.zeros_like(d["kl"])
    adv[keep], ret[keep] = out.advantages, out.returns
    return adv, ret


def _diff(a, b, mask) -> float | None:
    if a is None or b is None:
        return None
    m = mask.bool()
    return float(max((a[0][m] - b[0][m]).abs().max(), (a[1][m] - b[1][m]).abs().max()))


def parity() -> dict:
    """For each case x setting: the largest difference, over kept samples' action tokens, of the
    advantages and returns of (single machine, OpenRLHF stock, OpenRLHF with the hook), and the
    largest |advantage| of each. Stock runs first (the hook, once installed, stays)."""
    from openrlhf.utils.agent import AgentExecutorBase  # noqa: F401  (OpenRLHF present)

    from r3rag.train.openrlhf import per_step

    cases = parity_cases()
    data = {}
    for ci, case in enumerate(cases):
        for si, (name, steps, doc, dropped, kind) in enumerate(SETTINGS):
            g = torch.Generator().manual_seed(1000 * ci + si)
            data[(ci, si)] = _tensors(_rows(g, case["n"], steps, doc, dropped, kind), g)
    openrlhf_est = {c["estimator"] for c in cases if c["name"].startswith("openrlhf ")}
    stock_out = {k: _openrlhf_run(cases[k[0]], d, hook=False) for k, d in data.items() if cases[k[0]]["estimator"] in openrlhf_est}
    ref_stock = reference_gae(hook=False)
    per_step.install()
    flags = _flags()
    parser = flags.openrlhf_parser()
    out = {"cases": cases, "settings": [s[0] for s in SETTINGS], "results": [],
           "openrlhf_estimators": list(flags.option(parser, "--algo.advantage.estimator").choices),
           "openrlhf_clip_range": list(flags.option(parser, "--reward.clip_range").default)}
    for (ci, si), d in data.items():
        case = cases[ci]
        single = _single_run(case, d)
        hooked = _openrlhf_run(case, d, hook=True) if case["estimator"] in openrlhf_est else None
        stock_ = stock_out.get((ci, si))
        mask = d["mask"]
        big = lambda x: None if x is None else float(x[0][mask.bool()].abs().max())  # noqa: E731
        out["results"].append({
            "case": case["name"], "setting": SETTINGS[si][0],
            "single_vs_hook": _diff(single, hooked, mask), "single_vs_stock": _diff(single, stock_, mask),
            "hook_vs_stock": _diff(hooked, stock_, mask),
            "max_abs_single": big(single), "max_abs_hook": big(hooked), "max_abs_stock": big(stock_),
            "finite": all(bool(torch.isfinite(x[0]).all()) for x in (single, hooked, stock_) if x is not None),
        })
    out["reference_gae"] = {doc: {**v, "stock": ref_stock[doc]["openrlhf"]} for doc, v in reference_gae(hook=True).items()}
    return out


def reference_gae(hook: bool) -> dict:
    """Step rewards 0.6 then 2.0 (steps of 1 and 4 tokens), zero values, gamma 1, lambd 0.95, a
    document of 5 / 50 / 300 tokens between the steps: the GAE return at the first step's token,
    single machine and OpenRLHF (with the hook when it is installed, else stock)."""
    from r3rag.train.rl.estimators import compute_advantages

    case = {"name": "ref", "estimator": "gae", "gamma": 1.0, "lambd": 0.95, "clip": None, "kl_coef": 0.0, "n": 2}
    res = {}
    for doc in (5, 50, 300):
        L = 2 + doc + 4 + 1
        mask, steps = torch.zeros(2, L), torch.zeros(2, L)
        for b in range(2):
            mask[b, 1] = 1
            mask[b, 2 + doc: 6 + doc] = 1
            steps[b, 1], steps[b, 5 + doc] = 0.6, 2.0
        d = {"mask": mask, "steps": steps, "totals": torch.tensor([2.6, 2.6]), "drop": torch.tensor([False, False]),
             "group": torch.tensor([0, 0]), "kl": torch.zeros(2, L), "values": torch.zeros(2, L), "perm": torch.tensor([1, 0])}
        single = compute_advantages("gae", steps, mask, d["group"], values=d["values"], gamma=1.0, lambd=0.95)
        _, theirs = _openrlhf_run(case, d, hook=hook)
        res[str(doc)] = {"single": float(single.returns[0, 1]), "openrlhf": float(theirs[0, 1])}
    return res


if __name__ == "__main__":
    what = sys.argv[1]
    result = stock() if what == "stock" else parity() if what == "parity" else flags(sys.argv[2])
    print("R3RAG-RESULT " + json.dumps(result))

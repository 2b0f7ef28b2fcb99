"""Reward throughput and judge concurrency.

1. Rule-based recipes (r3rag with gold relevance, r1searcher_stage1, r1searcher_stage2) score N
   synthetic trajectories (mixed: correct, wrong, no answer, format errors, 0-4 retrievals);
   trajectories/s, and the ratio to a baseline in the same run: computing only the token F1 of
   each final answer (the least any answer reward must do).
2. Judge: the same batch of distinct requests against a local stand-in OpenAI server (its own
   process) with
   ``--latency-ms`` latency, sequentially (concurrency 1) and with ``--concurrency`` in flight
   (median of three batches), after a warm-up call that opens the connections (the steady state
   of a training loop); speed-up = sequential time / concurrent time (goal >= 8x at 16). A repeat
   of a batch is answered from the cache: its time is reported too. Client and stand-in share
   this machine's CPUs, so on a loaded machine the ratio is CPU-bound, not latency-bound: the
   client's CPU ms per request is reported to show it.

The last line printed is a one-line JSON summary.

    python benchmark/perf/rewards.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from r3rag.cli import ArgumentParser, run_main
from r3rag.data.records import Passage
from r3rag.metrics import f1_score
from r3rag.rewards import load_recipe
from r3rag.rewards.judge import JudgeClient, JudgeConfig
from r3rag.rollout.trajectory import Segment, Step, Trajectory
from r3rag.testing.standin_judge import StandinJudgeProcess

NAMES = ["Ora Lind", "Ari Voss", "Tam Hale", "Ira Quell", "Bo Renn", "Uma Feld"]


def synth_r3rag(rng: random.Random, i: int) -> Trajectory:
    gold = rng.choice(NAMES)
    steps: list[Step] = []
    for k in range(rng.randint(0, 4)):
        ids = [f"p{rng.randint(0, 50)}" for _ in range(2)]
        query = f"who is related to entity {rng.randint(0, 9)}"
        raw = f"Step {k + 1}:\nThe problem analysis: need hop {k}.\nThe retrieval query: {query}"
        if rng.random() < 0.05:
            raw = f"The retrieval query: {query}"  # format error
        steps.append(Step(k, analysis=f"need hop {k}.", query=query, documents=[Passage(x, "T\ntext") for x in ids], raw=raw))
    if rng.random() < 0.85:
        ans = gold if rng.random() < 0.5 else rng.choice(NAMES)
        steps.append(Step(len(steps), analysis="known.", answer=ans, raw=f"Step {len(steps) + 1}:\nThe problem analysis: known.\nThe final answer: {ans}"))
    return Trajectory(f"q{i}", "Who?", "r3rag_steps", steps=steps, golden_answers=[gold],
                      metadata={"supporting_ids": [f"p{rng.randint(0, 50)}", f"p{rng.randint(0, 50)}"]})


def synth_r1(rng: random.Random, i: int) -> Trajectory:
    gold = rng.choice(NAMES)
    segs = [Segment("prompt", "Question: Who?", [])]
    steps: list[Step] = []
    text = "<think>Let me search."
    for k in range(rng.randint(0, 4)):
        q = f"entity {rng.randint(0, 9)} relation"
        text += f"<|begin_of_query|>{q}<|end_of_query|>"
        segs.append(Segment("model", text, []))
        segs.append(Segment("env", "<|begin_of_documents|>\n(1)T\ntext\n<|end_of_documents|>", []))
        steps.append(Step(k, query=q, documents=[Passage(f"p{k}", "T\ntext")]))
        text = " Found something."
    ans = gold if rng.random() < 0.5 else rng.choice(NAMES)
    tail = rng.choice(["", "", "", " extra words"])  # some text after the answer
    text += f"</think>\n<answer>{ans}</answer>{tail}"
    segs.append(Segment("model", text, []))
    steps.append(Step(len(steps), answer=ans))
    return Trajectory(f"q{i}", "Who?", "r1searcher_tags", segments=segs, steps=steps, golden_answers=[gold])


def throughput(n: int, batch: int, recipe_dir: Path, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    r3 = [synth_r3rag(rng, i) for i in range(n)]
    r1 = [synth_r1(rng, i) for i in range(n)]
    t0 = time.perf_counter()
    for t in r1:
        f1_score(t.answer or "", t.golden_answers, "r1searcher")
    base = n / (time.perf_counter() - t0)
    out = {"baseline_f1_only_traj_per_s": round(base, 1)}
    print(f"baseline (token F1 of the answer only): {base:,.0f} trajectories/s", flush=True)
    for name, trajs in (("r3rag", r3), ("r1searcher_stage1", r1), ("r1searcher_stage2", r1)):
        scorer = load_recipe(recipe_dir / f"{name}.yaml")
        t0 = time.perf_counter()
        for j in tqdm(range(0, n, batch), desc=name, file=sys.stderr, leave=False, disable=None):
            scorer.score(trajs[j : j + batch])
        rate = n / (time.perf_counter() - t0)
        out[f"{name}_traj_per_s"] = round(rate, 1)
        out[f"{name}_vs_baseline"] = round(rate / base, 3)
        print(f"{name}: {rate:,.0f} trajectories/s ({rate / base:.2f}x the F1-only baseline)", flush=True)
    return out


def judge_concurrency(requests: int, latency_ms: float, concurrency: int) -> dict[str, float]:
    with StandinJudgeProcess(mode="correct", latency_s=latency_ms / 1000, engine="minimal") as server, tempfile.TemporaryDirectory() as tmp:

        def timed(client: JudgeClient, tag: str) -> tuple[float, float, list]:
            reqs = [client.correctness_request(f"Question {tag} {i}?", f"answer {i}", [f"answer {i}"]) for i in range(requests)]
            t0, c0 = time.perf_counter(), time.process_time()
            res = client.judge(reqs)
            elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
            if not all(r.ok for r in res):
                raise RuntimeError(f"judge benchmark: {client.stats.as_dict()}")
            return elapsed, cpu * 1000 / requests, reqs

        def warm(client: JudgeClient, conc: int) -> None:  # steady state: connections open, as in training
            client.judge([client.correctness_request(f"warm {i}", "a", ["a"]) for i in range(conc)])

        seq = JudgeClient(JudgeConfig(base_url=server.base_url, concurrency=1, cache_path=None, max_retries=0))
        warm(seq, 1)
        seq_s, _, _ = timed(seq, "seq")
        conc = JudgeClient(JudgeConfig(base_url=server.base_url, concurrency=concurrency,
                                       cache_path=os.path.join(tmp, "cache.sqlite"), max_retries=0))
        warm(conc, concurrency)
        runs = sorted((timed(conc, f"conc{k}") for k in range(3)), key=lambda r: r[0])
        conc_s, cpu_ms, reqs = runs[1]  # the median of three
        t1 = time.perf_counter()
        conc.judge(reqs)  # the same requests again: all cache hits
        repeat_s = time.perf_counter() - t1
        client = conc
        seq.close()
        conc.close()
        bound = -(-requests // concurrency) * latency_ms / 1000  # latency-only floor
        speedup = seq_s / conc_s
        print(f"judge: {requests} requests at {latency_ms:.0f} ms: sequential {seq_s:.2f} s, "
              f"{concurrency} concurrent {conc_s:.2f} s ({speedup:.1f}x); cached repeat {repeat_s * 1000:.1f} ms "
              f"({client.stats.cache_hits} hits); client CPU {cpu_ms:.2f} ms/request; latency-only floor {bound:.2f} s", flush=True)
        return {
            "judge_requests": requests,
            "judge_latency_ms": latency_ms,
            "judge_sequential_s": round(seq_s, 3),
            "judge_concurrent_s": round(conc_s, 3),
            "judge_concurrency": concurrency,
            "judge_speedup": round(speedup, 2),
            "judge_cached_repeat_s": round(repeat_s, 4),
            "judge_cache_hits": client.stats.cache_hits,
            "judge_client_cpu_ms_per_request": round(cpu_ms, 3),
            "judge_latency_floor_s": round(bound, 3),
        }


def main() -> int:
    parser = ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10,000 trajectories and 64 judge requests")
    parser.add_argument("--trajectories", type=int, default=100_000, help="trajectories per recipe (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=1024, help="scoring batch size (default: %(default)s)")
    parser.add_argument("--judge-requests", type=int, default=128, help="distinct judge requests (default: %(default)s)")
    parser.add_argument("--latency-ms", type=float, default=50.0, help="stand-in judge latency (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=16, help="judge requests in flight (default: %(default)s)")
    parser.add_argument("--recipe-dir", type=Path, default=Path(__file__).resolve().parents[2] / "configs" / "rewards",
                        help="folder of recipe YAMLs (default: the repository's configs/rewards)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n = 10_000 if args.quick else args.trajectories
    requests = 64 if args.quick else args.judge_requests
    summary: dict[str, object] = {"benchmark": "rewards", "quick": args.quick, "trajectories": n}
    summary.update(throughput(n, args.batch, args.recipe_dir, args.seed))
    summary.update(judge_concurrency(requests, args.latency_ms, args.concurrency))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

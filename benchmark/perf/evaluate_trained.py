"""Where the time of evaluating a *trained* step-by-step model goes, and what makes it shorter.

A trained model (SFT, RL) is evaluated with the plain step prompt and, unlike the prompted base,
searches 2-3 times per question, so each question costs several rounds of: prefill of the new
documents, decoding of the next step, a retrieval round. This benchmark runs the world's dev
questions through the rollout engine exactly as the quickstart's evaluation does (the HTTP
retrieval service in this process, greedy, R3-RAG's step format, plain prompt) and splits the wall
time into prefill (tokens, ms/token), decode (steps, rows per step, ms/step), the backend's
Python work between forward passes, retrieval and the engine's bookkeeping
(:class:`r3rag.evaluation.profile.ForwardTimer` + the engine's counters).

Wall times depend on what else runs on the cores; the process CPU time (all threads) is reported
beside them as the measure of the work itself, with the 1-minute load average.

The policy:

- ``--model PATH`` of a trained checkpoint: the real thing;
- ``--policy forced-oracle`` (the default with the untrained ``smollm2``): SmolLM2 is *forced* to
  write the world oracle's turns (:class:`r3rag.rollout.backends.forced.ForcedBackend`), one token
  per decode step with the KV cache, exactly the compute of a student that imitates its teacher
  (same number of steps, retrievals, turn and document lengths) without a trained checkpoint.

Each ``--batch`` value (comma list) and ``--dtype`` value is one run over the same questions; the
last line is a one-line JSON summary with the seconds per question and the projected time for 300.

    python benchmark/perf/evaluate_trained.py --quick
    python benchmark/perf/evaluate_trained.py --questions 64 --batch 32,64 --dtype float32,bfloat16
    python benchmark/perf/evaluate_trained.py --model runs/quickstart/sft/final --questions 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.machine import cpu_name  # noqa: E402


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model, 8 questions (seconds)")
    p.add_argument("--model", default="smollm2", help="policy model (default: %(default)s)")
    p.add_argument("--policy", choices=["auto", "model", "forced-oracle"], default="auto",
                   help="auto: forced-oracle for the untrained smollm2, else the model's own turns")
    p.add_argument("--questions", type=int, default=64, help="dev questions (default: %(default)s)")
    p.add_argument("--batch", default="32", help="questions per engine call, comma list (default: %(default)s)")
    p.add_argument("--rows", type=int, default=0,
                   help="rows per forward pass (the backend's max_batch_size); 0: the same as --batch")
    p.add_argument("--dtype", default="float32", help="model dtype(s), comma list: float32,bfloat16 (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads (default: %(default)s)")
    p.add_argument("--world-size", default="small", help="world size (default: %(default)s; medium for > 80 questions)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="rollout overrides, e.g. --set max_turn_tokens=64")
    args = p.parse_args()

    import torch

    from r3rag.config import load_config
    from r3rag.evaluation.components import world_index
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.evaluation.profile import ForwardTimer
    from r3rag.data.readers import read_questions
    from r3rag.retrieval.client import RetrievalClient
    from r3rag.retrieval.service import serve_in_thread
    from r3rag.rollout.backends.forced import ForcedBackend
    from r3rag.rollout.backends.hf import HFBackend, load_model
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats.registry import get_format
    from r3rag.rollout.oracle import OracleBackend

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-evaltrained-"))
    model_path, n_q = args.model, args.questions
    if args.quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model_path, n_q = str(save_tiny_model(tmp / "tiny")), 8
    policy = args.policy if args.policy != "auto" else ("forced-oracle" if args.model == "smollm2" or args.quick else "model")
    world = ensure_world(Path("runs") / f"world-{args.world_size}" if not args.quick else tmp / "world", size=args.world_size)
    questions = read_questions(world / "dev.jsonl", n_q)
    # the quickstart's evaluation settings (configs/evaluate/embedded-cpu.yaml), plain prompt
    rollout = load_config(RolloutConfig, None, [
        "format=r3rag_steps", "mode=chat", "prompt_variant=standard", "max_steps=4", "docs_per_step=3",
        "doc_max_chars=300", "max_turn_tokens=96", "max_new_tokens=320", "max_total_tokens=4096", "temperature=0",
        *args.overrides])
    handle = serve_in_thread([world_index(world)], bm25_backend="numpy")
    results = []
    try:
        for dtype in [d.strip() for d in args.dtype.split(",") if d.strip()]:
            model, tok = load_model(model_path, dtype=dtype)
            for batch in [int(b) for b in args.batch.split(",")]:
                rows_per_pass = args.rows or batch
                hf = HFBackend(model, tok, max_batch_size=rows_per_pass)
                fmt = get_format(rollout.format, mode=rollout.mode, tokenizer=tok, prompt_variant=rollout.prompt_variant)
                backend = ForcedBackend(hf, OracleBackend(questions, fmt, tok)) if policy == "forced-oracle" else hf
                retriever = RetrievalClient([handle.url])
                engine = RolloutEngine(backend, retriever, rollout, fmt=fmt)
                trajs = []
                t0, c0 = time.perf_counter(), time.process_time()
                with ForwardTimer(model) as timer:
                    for i in range(0, len(questions), batch):
                        trajs += asyncio.run(engine.arun(questions[i:i + batch], n_samples=1))
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                asyncio.run(retriever.aclose())
                st, fw = engine.stats.to_dict(), timer.summary()
                n = len(trajs)
                row = {
                    "dtype": dtype, "batch": batch, "rows": rows_per_pass, "questions": n, "wall_s": round(wall, 2), "s_per_q": round(wall / n, 3),
                    "projected_300_s": round(300 * wall / n, 1), "cpu_s": round(cpu, 2), "cpu_s_per_q": round(cpu / n, 3),
                    "load_avg_1min": os.getloadavg()[0],
                    "retrievals_per_q": round(sum(t.num_retrievals for t in trajs) / n, 2),
                    "generated_tokens_per_q": round(sum(t.num_generated_tokens for t in trajs) / n, 1),
                    "rounds": st["rounds"], "generate_s": round(st["generate_s"], 2), "retrieve_s": round(st["retrieve_s"], 2),
                    "engine_other_s": round(st["other_s"], 2), **fw,
                    "backend_python_s": round(st["generate_s"] - fw["forward_s"], 2),
                }
                if policy == "forced-oracle":  # the teacher's own time (a real student has none of it)
                    row["note"] = "generate_s includes the oracle teacher's text work"
                results.append(row)
                print(f"{dtype:>8} batch {batch:>3}: {n} q in {wall:.1f} s = {wall / n:.2f} s/q, CPU {cpu / n:.2f} s/q "
                      f"(load {os.getloadavg()[0]:.1f}) "
                      f"(300 q: {300 * wall / n / 60:.1f} min) | prefill {fw['prefill_s']:.1f} s "
                      f"({fw['prefill_tokens']} tok, {fw['prefill_ms_per_token']} ms/tok) | decode {fw['decode_s']:.1f} s "
                      f"({fw['decode_steps']} steps x {fw['decode_rows_mean']} rows, {fw['decode_ms_per_step']} ms/step) | "
                      f"backend python {row['backend_python_s']:.1f} s | retrieval {st['retrieve_s']:.1f} s | "
                      f"{row['retrievals_per_q']} retrievals/q, {row['generated_tokens_per_q']} tokens/q", flush=True)
            del model
    finally:
        handle.stop()
    print(json.dumps({"benchmark": "evaluate_trained", "quick": args.quick, "model": Path(model_path).name, "policy": policy,
                      "threads": args.threads, "cpu": cpu_name(), "runs": results}))
    return 0


if __name__ == "__main__":
    run_main(main)

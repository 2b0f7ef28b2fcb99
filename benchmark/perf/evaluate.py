"""Evaluation throughput: the batched engine against batch size 1, same questions.

Runs ``benchmark/evaluate.py run`` in-process twice on the same world dev questions with the same
model, once with ``run.batch_size = model.max_batch_size = 1`` (the baseline: one question at a
time) and once with ``--batch`` questions per engine call, and reports questions per second for
each and the speed-up (goal >= 4x with SmolLM2-135M on CPU); ``--repeat N`` times both N times
and reports the median of the N ratios (the machines are noisy, and a plain-prompt run is
short). The model is loaded once before any timing starts, and every timed run starts with empty
KV caches; retrieval is the world's BM25 index in-process. Greedy decoding, so the two
runs should agree; the share of identical predictions is reported (left padding can flip a
near-tie in float32).

Both runs use the same backend features (per-trajectory KV prefix cache, shared system-prompt
prefix); only the batch size differs. ``--set model.shared_prefix_tokens=0`` turns the shared
prefix off in both. Torch uses every core this process may run on unless ``--threads`` says
otherwise.

The last line printed is a one-line JSON summary.

    python benchmark/perf/evaluate.py --quick          # tiny random model, 4 questions
    python benchmark/perf/evaluate.py                   # SmolLM2, 32 questions, batch 32, all cores
    python benchmark/perf/evaluate.py --repeat 3        # median of 3 rounds
    python benchmark/perf/evaluate.py --threads 1 --questions 16 --batch 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny random model and 4 questions (seconds)")
    p.add_argument("--model", default="smollm2", help="policy model (default: %(default)s)")
    p.add_argument("--method", default="r3rag_steps", help="evaluation method (default: %(default)s)")
    p.add_argument("--questions", type=int, default=32, help="dev questions (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32, help="questions per engine call when batched (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads (default: the cores this process may use, %(default)s here)")
    p.add_argument("--repeat", type=int, default=1,
                   help="timed rounds, each batch 1 then batched; the speed-up is the median of the rounds' ratios "
                        "(default: %(default)s)")
    p.add_argument("--dtype", default="float32", help="model dtype (default: %(default)s)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="extra evaluation config overrides")
    args = p.parse_args()

    import torch

    from r3rag.config import load_config
    from r3rag.evaluation.components import load_backend
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.evaluation.predictions import load_rows
    from r3rag.evaluation.runner import run_evaluation

    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="r3rag-perf-eval-"))
    world = ensure_world(tmp / "world")
    model = args.model
    questions, batch = args.questions, args.batch
    if args.quick:
        from r3rag.testing.tiny_models import save_tiny_model

        model = str(save_tiny_model(tmp / "tiny"))
        questions, batch = 4, 4
    base = [f"dataset.world_dir={world}", f"dataset.limit={questions}", f"method.name={args.method}",
            f"model.path={model}", f"model.dtype={args.dtype}", "run.progress=false", "run.bootstrap=0",
            "rollout.max_steps=3", "rollout.max_turn_tokens=64", "rollout.max_new_tokens=192",
            "rollout.docs_per_step=3", "rollout.doc_max_chars=300", *args.overrides]

    def cfg(b: int) -> EvaluationConfig:
        return load_config(EvaluationConfig, None, base + [f"run.batch_size={b}", f"model.max_batch_size={b}"])

    t0 = time.perf_counter()
    for b in (1, batch):
        load_backend(cfg(b).model)  # load (and keep) the model before any timing
    load_s = time.perf_counter() - t0
    timings: dict[int, list[float]] = {1: [], batch: []}
    preds: dict[int, dict[str, str]] = {}
    tokens: dict[int, float] = {}
    shared: dict[int, int] = {}
    for r in range(args.repeat):
        for b in (1, batch):
            backend = load_backend(cfg(b).model)
            if hasattr(backend, "clear_cache"):
                backend.clear_cache()  # every timed run starts cold, as a fresh process would
            rows0 = getattr(getattr(backend, "shared", None), "rows", 0)
            out_dir = tmp / f"b{b}-r{r}"
            t = time.perf_counter()
            out = run_evaluation(cfg(b), out_dir)
            timings[b].append(time.perf_counter() - t)
            shared[b] = getattr(getattr(backend, "shared", None), "rows", 0) - rows0
            preds[b] = {row["id"]: row["prediction"] for row in load_rows(out_dir / "predictions.jsonl")}
            tokens[b] = out.results["avg_generated_tokens"]
            dt = timings[b][-1]
            print(f"round {r + 1}/{args.repeat} batch {b:>3}: {questions} questions in {dt:.1f} s = {questions / dt:.3f} q/s "
                  f"({tokens[b]:.0f} generated tokens/q; {shared[b]} rows started from a shared prompt prefix)")
    same = sum(preds[1][k] == preds[batch].get(k) for k in preds[1]) / max(len(preds[1]), 1)
    ratios = [t1 / tb for t1, tb in zip(timings[1], timings[batch])]
    speedup = statistics.median(ratios)
    t1, tb = statistics.median(timings[1]), statistics.median(timings[batch])
    print(f"speed-up {speedup:.2f}x, median of {args.repeat} round(s) {', '.join(f'{x:.2f}' for x in ratios)} "
          f"(goal >= 4x); identical predictions {100 * same:.0f}%")
    print(json.dumps({
        "benchmark": "evaluate", "quick": args.quick, "model": Path(model).name, "method": args.method,
        "questions": questions, "batch": batch, "threads": args.threads, "dtype": args.dtype,
        "repeat": args.repeat, "model_load_s": round(load_s, 1),
        "batch1_s": round(t1, 2), "batched_s": round(tb, 2),
        "batch1_qps": round(questions / t1, 4), "batched_qps": round(questions / tb, 4),
        "speedup": round(speedup, 2), "speedups": [round(x, 2) for x in ratios], "same_predictions": round(same, 3),
        "shared_prefix_rows": {"batch1": shared[1], "batched": shared[batch]},
    }))
    return 0


if __name__ == "__main__":
    run_main(main)

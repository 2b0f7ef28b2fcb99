"""Evaluation throughput: the batched engine against batch size 1, same questions (issue 6).

Runs ``benchmark/evaluate.py run`` in-process twice on the same world dev questions with the same
model, once with ``run.batch_size = model.max_batch_size = 1`` (the baseline: one question at a
time) and once with ``--batch`` questions per engine call, and reports questions per second for
each and the speed-up (goal >= 4x with SmolLM2-135M on CPU). The model is loaded once before
either timing starts; retrieval is the world's BM25 index in-process. Greedy decoding, so the two
runs should agree; the share of identical predictions is reported (left padding can flip a
near-tie in float32).

Both runs use the same backend features (per-trajectory KV prefix cache, shared system-prompt
prefix); only the batch size differs. ``--set model.shared_prefix_tokens=0`` turns the shared
prefix off in both. Torch uses every core this process may run on unless ``--threads`` says
otherwise.

The last line printed is a one-line JSON summary.

    python benchmark/perf/evaluate.py --quick          # tiny random model, 4 questions
    python benchmark/perf/evaluate.py                   # SmolLM2, 32 questions, batch 32, all cores
    python benchmark/perf/evaluate.py --threads 1 --questions 16 --batch 16
"""

from __future__ import annotations

import argparse
import json
import os
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
    p.add_argument("--method", default="r3rag", help="evaluation method (default: %(default)s)")
    p.add_argument("--questions", type=int, default=32, help="dev questions (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32, help="questions per engine call when batched (default: %(default)s)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads (default: the cores this process may use, %(default)s here)")
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
    timings: dict[int, float] = {}
    preds: dict[int, dict[str, str]] = {}
    tokens: dict[int, float] = {}
    shared: dict[int, int] = {}
    for b in (1, batch):
        backend = load_backend(cfg(b).model)
        hits0 = getattr(getattr(backend, "shared", None), "hits", 0)
        t = time.perf_counter()
        out = run_evaluation(cfg(b), tmp / f"b{b}")
        timings[b] = time.perf_counter() - t
        shared[b] = getattr(getattr(backend, "shared", None), "hits", 0) - hits0
        preds[b] = {r["id"]: r["prediction"] for r in load_rows(tmp / f"b{b}" / "predictions.jsonl")}
        tokens[b] = out.results["avg_generated_tokens"]
        print(f"batch {b:>3}: {questions} questions in {timings[b]:.1f} s = {questions / timings[b]:.3f} q/s "
              f"({tokens[b]:.0f} generated tokens/q; {shared[b]} rows started from a shared prompt prefix)")
    same = sum(preds[1][k] == preds[batch].get(k) for k in preds[1]) / max(len(preds[1]), 1)
    speedup = timings[1] / timings[batch]
    print(f"speed-up {speedup:.2f}x (goal >= 4x); identical predictions {100 * same:.0f}%")
    print(json.dumps({
        "benchmark": "evaluate", "quick": args.quick, "model": Path(model).name, "method": args.method,
        "questions": questions, "batch": batch, "threads": args.threads, "dtype": args.dtype,
        "model_load_s": round(load_s, 1),
        "batch1_s": round(timings[1], 2), "batched_s": round(timings[batch], 2),
        "batch1_qps": round(questions / timings[1], 4), "batched_qps": round(questions / timings[batch], 4),
        "speedup": round(speedup, 2), "same_predictions": round(same, 3),
        "shared_prefix_rows": {"batch1": shared[1], "batched": shared[batch]},
    }))
    return 0


if __name__ == "__main__":
    run_main(main)

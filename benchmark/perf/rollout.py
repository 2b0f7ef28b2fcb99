"""Rollout engine vs a naive loop, on the embedded world through a local BM25 retrieval service.

For each model (a tiny random Llama; SmolLM2-135M-Instruct unless ``--quick``) the policy is the
oracle's text teacher-forced through the model (:class:`ForcedBackend`): the model does the real
batched forward passes for every token, and every trajectory asks the gold number of queries, so
both runs do identical work. We measure, in one run:

- throughput of the engine at batch ``--batch`` vs a naive loop (one trajectory at a time, one
  retrieval request per query; same backend, model and retriever) -> ``engine_over_naive``,
  measured per generated token (the same as trajectories/s when the naive loop runs the whole
  batch, the default for the tiny model; SmolLM2's naive loop runs an even spread of 8);
- HTTP requests the retrieval service received per engine round with queries (from ``/stats``)
  -> ``requests_per_round``;
- the share of the engine's wall time spent outside generation (retrieval, parsing, tokenising
  feedback, bookkeeping) -> ``overhead_share``.

The last line printed is a one-line JSON summary (figures of the first model, plus per-model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from r3rag.cli import ArgumentParser  # noqa: E402


def build_backend(name: str):
    from r3rag.rollout.backends.hf import HFBackend, load_model
    from r3rag.testing.tiny_models import build_tiny_model, build_tiny_tokenizer

    if name == "tiny":
        tok = build_tiny_tokenizer()
        return HFBackend(build_tiny_model(tok), tok)
    model, tok = load_model(name)
    return HFBackend(model, tok)


def run_one(model_name: str, questions, url: str, fmt_name: str, mode: str, naive_n: int, docs: int) -> dict:
    import httpx

    from r3rag.retrieval.client import RetrievalClient
    from r3rag.rollout.backends.forced import ForcedBackend
    from r3rag.rollout.config import RolloutConfig
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats import get_format
    from r3rag.rollout.oracle import OracleBackend

    t0 = time.perf_counter()
    hf = build_backend(model_name)
    load_s = time.perf_counter() - t0
    fmt = get_format(fmt_name, mode=mode, tokenizer=hf.tokenizer)
    backend = ForcedBackend(hf, OracleBackend(questions, fmt, hf.tokenizer))
    cfg = RolloutConfig(format=fmt_name, mode=mode, docs_per_step=docs, max_turn_tokens=128)

    def stats() -> int:
        return httpx.get(url + "/stats").json()["requests"]

    # warm-up (allocator, first-call costs) on two questions
    RolloutEngine(backend, RetrievalClient(url), cfg, fmt=fmt).run(questions[:2])

    before = stats()
    engine = RolloutEngine(backend, RetrievalClient(url), cfg, fmt=fmt)
    t = time.perf_counter()
    trajs = engine.run(questions)
    engine_s = time.perf_counter() - t
    served = stats() - before
    rounds_with_queries = engine.stats.retrieval_calls

    stride = max(1, len(questions) // naive_n)
    picked = list(range(0, len(questions), stride))[:naive_n]  # an even spread of the batch
    sub = [questions[i] for i in picked]
    t = time.perf_counter()
    naive_trajs = []
    naive_requests = stats()
    for q in sub:
        naive_trajs += RolloutEngine(backend, RetrievalClient(url), cfg, fmt=fmt).run([q])
    naive_s = time.perf_counter() - t
    naive_requests = stats() - naive_requests
    assert [t.token_ids for t in naive_trajs] == [trajs[i].token_ids for i in picked], "runs differ"
    engine_tps = len(trajs) / engine_s
    naive_tps = len(sub) / naive_s
    # per generated token, so a naive subset with shorter or longer trajectories compares fairly
    # (identical to the trajectory ratio when the naive loop runs the whole batch)
    engine_tok_s = engine.stats.generated_tokens / engine_s
    naive_tok_s = sum(t.num_generated_tokens for t in naive_trajs) / naive_s
    return {
        "model": model_name,
        "format": fmt_name,
        "mode": mode,
        "batch": len(questions),
        "load_s": round(load_s, 1),
        "engine_s": round(engine_s, 2),
        "engine_traj_per_s": round(engine_tps, 3),
        "naive_trajectories": len(sub),
        "naive_s": round(naive_s, 2),
        "naive_traj_per_s": round(naive_tps, 3),
        "engine_over_naive": round(engine_tok_s / naive_tok_s, 2),
        "traj_ratio": round(engine_tps / naive_tps, 2),
        "naive_generated_tokens": sum(t.num_generated_tokens for t in naive_trajs),
        "rounds": engine.stats.rounds,
        "rounds_with_queries": rounds_with_queries,
        "service_requests": served,
        "requests_per_round": round(served / max(rounds_with_queries, 1), 3),
        "naive_requests": naive_requests,
        "naive_queries": sum(t.num_retrievals for t in naive_trajs),
        "generate_s": round(engine.stats.generate_s, 2),
        "retrieve_s": round(engine.stats.retrieve_s, 3),
        "overhead_share": round(1 - engine.stats.generate_s / engine_s, 4),
        "generated_tokens": engine.stats.generated_tokens,
    }


def main() -> int:
    ap = ArgumentParser(description="Rollout engine vs naive loop (tiny model and SmolLM2), one JSON summary last.")
    ap.add_argument("--quick", action="store_true", help="tiny model only (< 3 minutes on 2 cores)")
    ap.add_argument("--batch", type=int, default=32, help="questions per engine batch (default: %(default)s)")
    ap.add_argument("--naive", type=int, default=None, help="trajectories in the naive loop (default: batch; 8 for SmolLM2)")
    ap.add_argument("--format", default="r3rag_steps")
    ap.add_argument("--mode", default="chat", choices=["chat", "raw"])
    ap.add_argument("--docs", type=int, default=3, help="documents per query (default: %(default)s)")
    ap.add_argument("--work", default=None, help="folder for the world and index (default: a temp dir)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from r3rag.data.readers import read_questions
    from r3rag.retrieval.service import serve_in_thread
    from r3rag.evaluation.components import prepare_world

    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="r3rag-bench-rollout-"))
    world, index = prepare_world(work, seed=0, size="small")
    questions = [q for split in ("dev", "test", "train") for q in read_questions(world / f"{split}.jsonl")][: args.batch]
    models = ["tiny"] if args.quick else ["tiny", "smollm2"]
    rows = []
    with serve_in_thread([index]) as handle:
        for m in models:
            naive = args.naive or (args.batch if m == "tiny" else min(8, args.batch))
            row = run_one(m, questions, handle.url, args.format, args.mode, naive, args.docs)
            print(json.dumps(row), flush=True)
            rows.append(row)
    first = rows[0]
    summary = {
        "engine_over_naive": first["engine_over_naive"],
        "requests_per_round": first["requests_per_round"],
        "overhead_share": first["overhead_share"],
        "per_model": {r["model"]: {k: r[k] for k in ("engine_over_naive", "requests_per_round", "overhead_share", "engine_traj_per_s", "naive_traj_per_s")} for r in rows},
        "batch": args.batch,
        "format": args.format,
        "mode": args.mode,
        "retriever": "bm25 HTTP service (127.0.0.1)",
        "policy": "oracle text teacher-forced through the model",
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

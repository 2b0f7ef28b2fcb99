#!/usr/bin/env python
"""Run the oracle policy on the embedded world through real BM25 retrieval and score it.

    python benchmark/oracle_eval.py --size small --seed 0               # through the HTTP service
    python benchmark/oracle_eval.py --in-process --set rollout.docs_per_step=3

Builds the world and its BM25 index under ``--work`` (reused when present), serves the index over
HTTP on 127.0.0.1 (or searches it in-process with ``--in-process``), runs the oracle in each
requested format and prints one JSON line per format and a summary last: exact match of the
oracle's answers against the gold answers (the world's retrieval upper bound for a
copy-the-decomposition policy), the share of questions where it gave up, the stop reasons, and
retrieval calls per round. The oracle writes text, so it runs with the library's built-in ChatML
tokenizer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.config import Section, add_config_args, load_config  # noqa: E402
from r3rag.rollout.config import RolloutConfig  # noqa: E402


class OracleEvalConfig(Section):
    rollout: RolloutConfig = RolloutConfig()


async def run_formats(questions: list[Any], retriever: Any, cfg: RolloutConfig, formats: list[str],
                      out_dir: Path | None) -> list[dict[str, Any]]:
    from r3rag.metrics import exact_match
    from r3rag.rollout.backends.hf_loading import load_tokenizer
    from r3rag.rollout.engine import RolloutEngine
    from r3rag.rollout.formats import get_format
    from r3rag.rollout.oracle import UNKNOWN, OracleBackend
    from r3rag.rollout.tiny_tokenizer import TINY_TOKENIZER

    tok = load_tokenizer(TINY_TOKENIZER)  # the oracle's text does not depend on the tokenizer
    rows = []
    for name in formats:
        c = cfg.model_copy(update={"format": name})
        fmt = get_format(name, mode=c.mode, tokenizer=tok, observation_role=c.observation_role)
        engine = RolloutEngine(OracleBackend(questions, fmt, tok), retriever, c, fmt=fmt)
        path = out_dir / f"oracle-{name}-{c.mode}.jsonl" if out_dir else None
        trajs = await engine.arun(questions, jsonl_path=path)
        em = [exact_match(t.answer or "", t.golden_answers) for t in trajs]
        rows.append({
            "format": name,
            "mode": c.mode,
            "questions": len(trajs),
            "em": round(100 * sum(em) / max(len(em), 1), 2),
            "gave_up": round(100 * sum(t.answer == UNKNOWN for t in trajs) / max(len(trajs), 1), 2),
            "stop_reasons": {r: sum(t.stop_reason == r for t in trajs) for r in sorted({t.stop_reason for t in trajs})},
            "rounds": engine.stats.rounds,
            "retrieval_calls": engine.stats.retrieval_calls,
        })
    return rows


def main() -> int:
    from r3rag.rollout.formats import FORMATS

    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="runs/oracle", help="folder for the world and its index (default: %(default)s)")
    ap.add_argument("--size", default="small", help="world size (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="world seed (default: %(default)s)")
    ap.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="world split (default: %(default)s)")
    ap.add_argument("--formats", nargs="+", default=sorted(FORMATS), choices=sorted(FORMATS),
                    help="trajectory formats (default: all registered)")
    ap.add_argument("--in-process", action="store_true", help="search the index in-process instead of over HTTP")
    ap.add_argument("--save", action="store_true", help="write the trajectories as JSONL under --work")
    add_config_args(ap)
    args = ap.parse_args()
    cfg = load_config(OracleEvalConfig, args.config, args.overrides).rollout
    from r3rag.data.readers import read_questions
    from r3rag.evaluation.components import prepare_world
    from r3rag.retrieval.searcher import load_searcher
    from r3rag.rollout.retriever import SearcherRetriever

    work = Path(args.work)
    world, index = prepare_world(work, args.seed, args.size)
    questions = read_questions(world / f"{args.split}.jsonl")
    out_dir = work if args.save else None
    if args.in_process:
        rows = asyncio.run(run_formats(questions, SearcherRetriever(load_searcher(index)), cfg, args.formats, out_dir))
        requests = None
    else:
        import httpx

        from r3rag.retrieval.client import RetrievalClient
        from r3rag.retrieval.service import serve_in_thread

        with serve_in_thread([index]) as handle:
            client = RetrievalClient(handle.url)
            rows = asyncio.run(run_formats(questions, client, cfg, args.formats, out_dir))
            requests = httpx.get(handle.url + "/stats").json().get("requests")
    for r in rows:
        print(json.dumps(r))
    summary = {f"oracle_em_{r['format']}": r["em"] for r in rows}
    summary.update(split=args.split, size=args.size, seed=args.seed, docs_per_step=cfg.docs_per_step,
                   via="in-process" if args.in_process else "service", service_requests=requests)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

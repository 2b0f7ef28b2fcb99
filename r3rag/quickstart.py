"""The main job on the embedded default: ``make quickstart`` (``python -m r3rag.quickstart``).

1. generate the embedded world (seeded: the same files every time) into ``WORK/world``;
2. build its BM25 index (``WORK/world/index_bm25``);
3. start the retrieval service on 127.0.0.1 (a free port) in this process;
4. evaluate, on the first ``--limit`` questions of the world's dev split: the oracle (the
   gold-decomposition policy: the retrieval upper bound of copying the decomposition), then
   SmolLM2-135M-Instruct (shipped on PyPI) with direct answer, standard RAG, R3-RAG's step format
   and R1-Searcher's tag format, each into ``WORK/eval/<method>``;
5. print the table, write the side-by-side report to ``WORK/report`` (compare.md/.csv/.png), and
   stop the service.

Everything is reused when present (the world, the index, finished predictions), so a second run
only recomputes the tables: a killed quickstart resumes where it stopped.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from r3rag.cli import ArgumentParser, run_main

DEFAULT_METHODS = ("oracle", "direct", "rag", "r3rag", "r1searcher")
_REPO_ROOT = Path(__file__).resolve().parents[1]


def _default_config() -> str | None:
    path = _REPO_ROOT / "configs" / "evaluate" / "embedded-cpu.yaml"
    return str(path) if path.is_file() else None


def main() -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="runs/quickstart", help="working folder (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="world seed (default: %(default)s)")
    parser.add_argument("--size", default="small", help="world size: small|medium|large (default: %(default)s)")
    parser.add_argument("--limit", type=int, default=32,
                        help="evaluate the first N dev questions (default: %(default)s; 0 = all)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="comma-separated methods (default: %(default)s; also: ircot)")
    parser.add_argument("--model", default="smollm2", help="policy model (default: the packaged SmolLM2-135M-Instruct)")
    parser.add_argument("--config", default=_default_config(), help="evaluation config (default: %(default)s)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override an evaluation config value (repeatable)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args()

    from r3rag.config import load_config
    from r3rag.evaluation.compare import compare_runs
    from r3rag.evaluation.components import world_index
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.evaluation.datasets import ensure_world
    from r3rag.evaluation.methods import check_method
    from r3rag.evaluation.runner import run_evaluation
    from r3rag.retrieval.service import serve_in_thread

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    for m in methods:
        check_method(m)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    work = Path(args.work)
    world = ensure_world(work / "world", seed=args.seed, size=args.size)
    n_dev = sum(1 for line in (world / "dev.jsonl").open(encoding="utf-8") if line.strip())
    print(f"[1/5] world: {world} (seed {args.seed}, size {args.size}, {n_dev} dev questions)")
    index = world_index(world, show_progress=False)
    print(f"[2/5] BM25 index: {index}")
    handle = serve_in_thread([index], bm25_backend="numpy")  # a 2k-passage world needs no numba compile
    try:
        print(f"[3/5] retrieval service: {handle.url}")
        limit = args.limit if args.limit and args.limit < n_dev else None
        subset = f"the first {limit} of {n_dev} dev questions (a subset, for time)" if limit else f"all {n_dev} dev questions"
        print(f"[4/5] evaluating {', '.join(methods)} on {subset}")
        run_dirs = []
        for m in methods:
            overrides = [f"dataset.world_dir={world}", f"dataset.world_seed={args.seed}", f"dataset.world_size={args.size}",
                         "dataset.name=world", "dataset.split=dev", f"retriever.urls=[{handle.url}]",
                         f"method.name={m}", f"model.path={args.model}", *args.overrides]
            if limit:
                overrides.append(f"dataset.limit={limit}")
            cfg = load_config(EvaluationConfig, args.config, overrides)
            t0 = time.perf_counter()
            outcome = run_evaluation(cfg, work / "eval" / m)
            metrics = outcome.results.get("metrics", {})
            print(f"      {m}: cover-EM {metrics.get('cover_em', 0.0):.1f}, EM {metrics.get('em', 0.0):.1f} "
                  f"({outcome.new} new, {outcome.skipped} reused, {time.perf_counter() - t0:.0f} s)")
            run_dirs.append(work / "eval" / m)
        report = work / "report"
        table = compare_runs(run_dirs, report)
    finally:
        handle.stop()
    print(f"[5/5] report: {report}/compare.md, compare.csv, compare.png; per-method reports in {work / 'eval'}")
    print()
    print(table)
    print()
    print(f"Evaluated on {subset}; 95% bootstrap intervals in brackets. Total {time.perf_counter() - start:.0f} s.")
    return 0


if __name__ == "__main__":
    run_main(main)

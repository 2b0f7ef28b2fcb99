#!/usr/bin/env python
"""r3rag evaluation.

Subcommands:
  run      evaluate a method (direct, rag, ircot, r3rag_steps, r1searcher_tags, oracle) on a dataset
           (hotpotqa, 2wiki, musique, bamboogle, world, or a JSONL path); resumable, shardable;
           writes predictions.jsonl, results.json, report.md, results.csv and PNG plots to --out.
           A question a service failed for (dead retriever, model server or judge) is never scored:
           it goes to failures.jsonl, the command ends with one error line and exit status 3, and
           rerunning the same command retries exactly those questions
  merge    join the shard folders of one run into one (same results as an unsharded run)
  compare  put finished runs side by side: one table and one plot
  score    re-score a JSONL of predictions (any system's) and print one JSON object with
           n, em, f1, cover_em, acc in percent. With --normalization r1searcher and
           --judge-field gpt4o_output it reproduces R1-Searcher's published ACC_R / ACC_L.

Examples:
  python benchmark/evaluate.py run --config configs/evaluate/embedded-cpu.yaml --method oracle --out runs/eval/oracle
  python benchmark/evaluate.py run --dataset hotpotqa --method rag --model smollm2 \
      --retriever-url http://127.0.0.1:8000 --limit 50 --out runs/eval/hotpotqa-rag
  python benchmark/evaluate.py run ... --shard 0/2 --out runs/s0   (and --shard 1/2 --out runs/s1 elsewhere)
  python benchmark/evaluate.py merge runs/s0 runs/s1 --out runs/merged
  python benchmark/evaluate.py compare runs/eval/* --out runs/eval/compare
  python benchmark/evaluate.py score --predictions preds.jsonl
  python benchmark/evaluate.py score --predictions hotpotqa_qwen.jsonl --prediction-field pred_ans \\
      --answer-field answer --normalization r1searcher --judge-field gpt4o_output
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.config import add_config_args  # noqa: E402
from r3rag.metrics import NORMALIZERS  # noqa: E402


def cmd_score(args: argparse.Namespace) -> int:
    from r3rag.evaluation.score import score_file

    result = score_file(
        args.predictions,
        prediction_field=args.prediction_field,
        answer_field=args.answer_field,
        normalization=args.normalization,
        judge_field=args.judge_field,
    )
    print(json.dumps(result))
    return 0


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The shorthand flags as dotted overrides (placed before --set, so --set wins)."""
    from r3rag.evaluation.config import FLAG_KEYS

    out = [f"{key}={getattr(args, flag)}" for flag, key in FLAG_KEYS.items() if getattr(args, flag) is not None]
    if args.retriever_url:
        out.append("retriever.urls=[" + ",".join(args.retriever_url) + "]")
    if args.judge:
        out.append("run.judge=true")
    if args.no_progress:
        out.append("run.progress=false")
    return out + list(args.overrides)


#: exit status when a service failed for some questions (a rerun retries them); 2 is a user error
EXIT_INCOMPLETE = 3


def _done_line(prefix: str, outcome) -> str:  # type: ignore[no-untyped-def]
    retried = f" ({outcome.retried} retried after an earlier failure)" if outcome.retried else ""
    failed = sum(outcome.failed.values()) + outcome.not_attempted
    failed_note = f", {failed} not evaluated (a service failed)" if failed else ""
    return f"{prefix}{outcome.new} new{retried}, {outcome.skipped} already done{failed_note}; results in {outcome.out_dir}"


def cmd_run(args: argparse.Namespace) -> int:
    """Run one method, or each of a comma-separated list into ``--out/METHOD``. When a service
    fails for some questions, the summary shows the scored ones with their count apart, and the
    command ends with one ``error:`` line and exit status 3 (the next method is not started)."""
    from r3rag.config import load_config
    from r3rag.evaluation.config import EvaluationConfig
    from r3rag.evaluation.failures import EvaluationIncomplete
    from r3rag.evaluation.report import results_table
    from r3rag.evaluation.runner import run_evaluation

    methods = [m.strip() for m in (args.method or "").split(",") if m.strip()]
    several = len(methods) > 1
    results = []
    for m in methods if several else [args.method]:
        args.method = m
        cfg = load_config(EvaluationConfig, args.config, run_overrides(args))
        try:
            outcome = run_evaluation(cfg, Path(args.out) / m if several else args.out)
        except EvaluationIncomplete as err:
            print(_done_line(f"{m}: " if several else "", err.outcome))
            table = [r for r in (*results, err.outcome.results) if r.get("n")]
            if table:
                print(results_table(table))
            print(f"error: {err}", file=sys.stderr)
            return EXIT_INCOMPLETE
        print(_done_line(f"{m}: " if several else "", outcome))
        results.append(outcome.results)
    table = [r for r in results if r.get("n")]
    if table:
        print(results_table(table))
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from r3rag.evaluation.merge import merge_runs
    from r3rag.evaluation.report import results_table

    results = merge_runs(args.shards, args.out)
    print(results_table([results]))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from r3rag.evaluation.compare import compare_runs

    print(compare_runs(args.runs, args.out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("score", help="re-score a predictions JSONL", description="Re-score a JSONL of predictions.")
    p.add_argument("--predictions", required=True, help="JSONL with one prediction per line")
    p.add_argument("--prediction-field", default=None, help="field holding the prediction (default: detect prediction/pred/pred_ans)")
    p.add_argument("--answer-field", default=None, help="field holding the gold answer(s) (default: detect golden_answers/answer/answers)")
    p.add_argument("--normalization", choices=sorted(NORMALIZERS), default="squad",
                   help="text normaliser: squad (FlashRAG, most papers) or r1searcher (R1-Searcher's tables); default %(default)s")
    p.add_argument("--judge-field", default=None, help="optional field with a judge verdict (True/False); adds judge_acc")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("run", help="evaluate a method on a dataset",
                       description="Evaluate a method on a dataset; rerunning the same command resumes.")
    add_config_args(p)
    p.add_argument("--dataset", help="hotpotqa | 2wiki | musique | bamboogle | world | PATH to a JSONL (default: world)")
    p.add_argument("--source", help="hotpotqa/2wiki/musique from 'hf' (the hub) or a local copy of a hub release")
    p.add_argument("--method", help="direct | rag | ircot | r3rag_steps | r1searcher_tags | oracle (default: r3rag_steps); "
                                    "a comma-separated list runs each into --out/METHOD with the model loaded once")
    p.add_argument("--model", help="local model folder, .gguf, 'smollm2' (packaged), or an OpenAI-compatible URL")
    p.add_argument("--retriever-url", action="append", default=[], metavar="URL",
                   help="retrieval service URL (repeatable; default for --dataset world: the world's own BM25 index, in-process; other datasets need one)")
    p.add_argument("--out", required=True, help="run folder: predictions.jsonl, results.json, report.md, plots")
    p.add_argument("--limit", type=int, help="first N questions of the dataset (after --skip)")
    p.add_argument("--skip", type=int, help="leave out the dataset's first N questions (e.g. those consulted while "
                                            "choosing a recipe); predictions keep their positions")
    p.add_argument("--shard", help="i/n: this machine's share (positions p with p %% n == i)")
    p.add_argument("--batch-size", type=int, help="questions per engine call (default from config: 16)")
    p.add_argument("--judge", action="store_true", help="also ask the LLM judge (judge.* settings) for ACC_L")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("merge", help="join shard folders", description="Join the shard folders of one run.")
    p.add_argument("shards", nargs="+", help="shard run folders")
    p.add_argument("--out", required=True, help="merged run folder")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("compare", help="runs side by side", description="Put finished runs side by side.")
    p.add_argument("runs", nargs="+", help="run folders (each with results.json)")
    p.add_argument("--out", help="folder for compare.md, compare.csv, compare.png")
    p.set_defaults(func=cmd_compare)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    return args.func(args)


if __name__ == "__main__":
    run_main(main)

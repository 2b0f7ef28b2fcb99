#!/usr/bin/env python
"""r3rag evaluation.

Subcommands:
  score   re-score a JSONL of predictions (any system's) and print one JSON object with
          n, em, f1, cover_em, acc in percent. With --normalization r1searcher and
          --judge-field gpt4o_output it reproduces R1-Searcher's published ACC_R / ACC_L.

Examples:
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

from r3rag.cli import run_main  # noqa: E402
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("score", help="re-score a predictions JSONL", description="Re-score a JSONL of predictions.")
    p.add_argument("--predictions", required=True, help="JSONL with one prediction per line")
    p.add_argument("--prediction-field", default=None, help="field holding the prediction (default: detect prediction/pred/pred_ans)")
    p.add_argument("--answer-field", default=None, help="field holding the gold answer(s) (default: detect golden_answers/answer/answers)")
    p.add_argument("--normalization", choices=sorted(NORMALIZERS), default="squad",
                   help="text normaliser: squad (FlashRAG, most papers) or r1searcher (R1-Searcher's tables); default %(default)s")
    p.add_argument("--judge-field", default=None, help="optional field with a judge verdict (True/False); adds judge_acc")
    p.set_defaults(func=cmd_score)
    return parser


def main() -> int:
    args = build_parser().parse_args()
    return args.func(args)


if __name__ == "__main__":
    run_main(main)

#!/usr/bin/env python
"""Check dataset and corpus JSONL files; print every bad record as ``file:line: problem``.

Question files may be FlashRAG (``id, question, golden_answers, metadata``) or R1-Searcher
(``idx, question, answer``); corpus files are FlashRAG (``id, contents``). The kind is detected
from the first record unless ``--kind`` says otherwise. Exits 1 if any problem was found.

    python data/validate.py runs/world/dev.jsonl runs/world/corpus.jsonl
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.data.readers import detect_kind, iter_problems  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", help="JSONL files to check")
    parser.add_argument("--kind", choices=["auto", "questions", "corpus"], default="auto", help="record kind (default: detect)")
    args = parser.parse_args()
    bad = 0
    for f in args.files:
        kind = args.kind
        if kind == "auto":
            kind = detect_kind(f) if Path(f).is_file() else "questions"
        problems = list(iter_problems(f, kind))
        for p in problems:
            print(p)
        bad += len(problems)
        if not problems:
            print(f"{f}: ok ({kind})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main)

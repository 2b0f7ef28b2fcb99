#!/usr/bin/env python
"""Check dataset, corpus and facts JSONL files; print every bad record as ``file:line: problem``.

Question files may be FlashRAG (``id, question, golden_answers, metadata``) or R1-Searcher
(``idx, question, answer``); corpus files are FlashRAG (``id, contents``); facts files are the
embedded world's relation table (``subject, subject_name, relation, object, value, passage_id``).
The kind is detected from the first record unless ``--kind`` says otherwise, and each file is
named with its kind (``FILE: ok (facts)``). A file whose first record is of no known kind is one
problem, not one per line; an empty file has no bad record and is reported as ``ok (..., empty)``
(a small world's split can be empty). Exits 1 if any problem was found.

    python data/validate.py runs/world/*.jsonl         # every file a world build writes
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.data.readers import KINDS, detect_kind, iter_problems  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("files", nargs="+", help="JSONL files to check")
    parser.add_argument("--kind", choices=["auto", *KINDS], default="auto", help="record kind (default: detect)")
    args = parser.parse_args()
    bad = 0
    for f in args.files:
        kind = args.kind
        if kind == "auto":
            kind = detect_kind(f) if Path(f).is_file() else "questions"
        if kind is None:
            problems = [f"{f}:1: not a question, corpus or facts record; pass --kind {'|'.join(KINDS)}"]
        else:
            problems = list(iter_problems(f, kind, allow_empty=True))
        for p in problems:
            print(p)
        bad += len(problems)
        if not problems:
            with open(f, "rb") as fh:
                empty = not any(line.strip() for line in fh)  # stops at the first record
            print(f"{f}: ok ({kind}{', empty' if empty else ''})", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    run_main(main)

#!/usr/bin/env python
"""Validate a world directory built by data/build_world.py.

Proves that every question's answer follows from its supporting passages (the relation table
yields each sub-answer, the sub-answer appears in its passage, the final answer follows from the
last sub-answer or the comparison), that every supporting passage is in the corpus, that no
entity appears in two splits, and that the files match the manifest's sha256. Prints every
problem as ``file:line: problem`` and exits 1 if there is any.

    python data/validate_world.py runs/world
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.errors import R3RagError  # noqa: E402
from r3rag.world import validate_world  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("world", help="world directory (with corpus.jsonl, train/dev/test.jsonl, facts.jsonl)")
    args = parser.parse_args()
    if not Path(args.world).is_dir():
        raise R3RagError(f"{args.world}: not a directory")
    problems = validate_world(args.world)
    for p in problems:
        print(p)
    if not problems:
        print(f"{args.world}: ok", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    run_main(main)

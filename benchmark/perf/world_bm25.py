#!/usr/bin/env python
"""How often does BM25 find each gold sub-question's supporting passage in the embedded world?

Builds the world (or reads --world DIR), indexes its corpus with bm25s (lower case, English stop
words, PyStemmer Snowball stemming; the same tokeniser for queries), searches every gold
sub-question of every question and reports the share of sub-questions whose supporting passage is
in the top k, and the share of questions whose sub-questions ALL hit. The world is meant to give
"most but not all" (target 60-90% of sub-questions): a teacher that copies the gold
decomposition should be imperfect. The baseline in the same run is the 1-hop questions' share
(`single_hit`), against which the multi-hop shares read as ratios.

The last line printed is one JSON object.

    python benchmark/perf/world_bm25.py --size small --seed 0
    python benchmark/perf/world_bm25.py --quick          # the tiny world
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.errors import R3RagError  # noqa: E402
from r3rag.world import SIZES, build_world  # noqa: E402
from r3rag.world.difficulty import subquestion_hits  # noqa: E402


def main() -> int:
    parser = ArgumentParser(description=__doc__)
    parser.add_argument("--size", choices=list(SIZES), default="small", help="world size to build (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="world seed (default: %(default)s)")
    parser.add_argument("--world", help="use an existing world directory instead of building one")
    parser.add_argument("--k", type=int, default=5, help="top-k cut-off (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="use the tiny world (a few seconds)")
    args = parser.parse_args()
    if args.k < 1:
        raise R3RagError("--k must be >= 1")
    size = "tiny" if args.quick else args.size
    with tempfile.TemporaryDirectory() as tmp:
        world = args.world
        build_s = None
        if world is None:
            start = time.perf_counter()
            build_world(tmp, seed=args.seed, size=size)
            build_s = round(time.perf_counter() - start, 3)
            world = tmp
        elif not (Path(world) / "corpus.jsonl").is_file():
            raise R3RagError(f"{world}: no corpus.jsonl (build one with data/build_world.py)")
        start = time.perf_counter()
        result = subquestion_hits(world, k=args.k)
        search_s = round(time.perf_counter() - start, 3)
    for hops, share in result["all_hit_by_hops"].items():
        print(f"{hops}-hop questions with every sub-question in the top {args.k}: {share:.1%}")
    for rel, share in result["subq_hit_by_relation"].items():
        print(f"  sub-questions asking {rel}: {share:.1%}")
    single = result["all_hit_by_hops"].get("1")
    summary = {
        "benchmark": "world_bm25",
        "size": "external" if args.world else size,
        "seed": args.seed,
        "k": args.k,
        "subquestions": result["subquestions"],
        "subq_hit": round(result["subq_hit"], 4),
        "questions": result["questions"],
        "all_hit": round(result["all_hit"], 4),
        "single_hit": single,
        "multi_vs_single": round(result["all_hit"] / single, 3) if single else None,
        "build_s": build_s,
        "index_and_search_s": search_s,
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

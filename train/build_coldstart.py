"""Build cold-start SFT data: a teacher reasons and retrieves, the first correct chain is kept.

R3-RAG's attempt policy (up to N chains per question, the first at temperature 0, the rest at
0.9, 3 documents per retrieval; correct by rule, else by the LLM judge) with the world's oracle,
an HF model or any OpenAI-compatible model as the teacher. Resumable after a kill (re-run the same
command), shardable (--set data.shard_index=I --set data.num_shards=N, same output.dir).

Writes OUT/trajectories (token-exact), OUT/sharegpt (LLaMA-Factory, documents only in observation
turns), OUT/alpaca_steps (R3-RAG's per-step layout), OUT/dataset_info.json and OUT/summary.json.

    python train/build_coldstart.py --config configs/coldstart/world-oracle.yaml
    python train/build_coldstart.py --config configs/coldstart/world-oracle.yaml \\
        --set rollout.format=r1searcher_tags --set output.dir=runs/coldstart/world-r1searcher_tags
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from r3rag.cli import ArgumentParser, run_main  # noqa: E402
from r3rag.config import add_config_args, load_config  # noqa: E402


def main() -> int:
    ap = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(ap, default="configs/coldstart/world-oracle.yaml")
    ap.add_argument("--out", help="output folder (same as --set output.dir=...)")
    args = ap.parse_args()
    from r3rag.train.coldstart.builder import build_coldstart
    from r3rag.train.coldstart.config import ColdStartConfig

    overrides = list(args.overrides) + ([f"output.dir={args.out}"] if args.out else [])
    cfg = load_config(ColdStartConfig, args.config, overrides)
    summary = build_coldstart(cfg)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    run_main(main)

"""Supervised fine-tuning on cold-start data through LLaMA-Factory (in its own virtual environment).

Writes LLaMA-Factory's YAML from an r3rag config and runs it with r3rag's chat template
registered (the tokens and loss mask LLaMA-Factory trains on are the RL rollout's). Every example
is measured first: one longer than data.cutoff_len (which LLaMA-Factory would cut) stops the run
with one line (exit 2), unless --set data.drop_longer=true leaves those out and says how many. The
cutoff defaults to the total budget of the config's rollout_profile. Re-running a killed run
resumes from its last checkpoint; a finished run is skipped unless --force.
Create the environment first: bash train/envs/llamafactory.sh

    python train/sft.py --config configs/sft/world-smollm2-cpu.yaml
    python train/sft.py --config configs/sft/r3rag-qwen2.5-7b.yaml --set launch.nproc_per_node=8
    python train/sft.py --config configs/sft/world-smollm2-cpu.yaml --dry-run   # print the YAML and command
    python train/sft.py --config configs/sft/world-smollm2-cpu.yaml --set data.cutoff_len=1024 --set data.drop_longer=true
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
    add_config_args(ap, default="configs/sft/world-smollm2-cpu.yaml")
    ap.add_argument("--force", action="store_true", help="train again even if the output folder holds a finished run")
    ap.add_argument("--dry-run", action="store_true", help="write the YAML, print it and the command, do not train")
    ap.add_argument("--log", help="write LLaMA-Factory's output to this file instead of the terminal")
    args = ap.parse_args()
    from r3rag.train.sft.config import SFTConfig
    from r3rag.train.sft.launch import prepare, run_sft

    cfg = load_config(SFTConfig, args.config, args.overrides)
    if args.dry_run:
        cmd, _, out = prepare(cfg, dry_run=True)
        print((out / "r3rag_sft.yaml").read_text(encoding="utf-8"))
        print(" ".join(cmd))
        return 0
    if args.log:
        Path(args.log).parent.mkdir(parents=True, exist_ok=True)
        with open(args.log, "a", encoding="utf-8") as log:
            result = run_sft(cfg, force=args.force, log=log)
    else:
        result = run_sft(cfg, force=args.force)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    run_main(main)

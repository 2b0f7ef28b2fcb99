#!/usr/bin/env bash
# R1-Searcher, both stages (STAGE=1|2 for one), for qwen2.5-7b (POLICY=...); everything else,
# including the hardware assumed (one node of 8 x 80 GB GPUs; NNODES=N for more), is in r1searcher.sh.
# Usage: POLICY=CKPT ... bash train/scripts/r1searcher_qwen2.5-7b.sh [--help]   (the variables: r1searcher.sh --help)
# Example: POLICY=/ckpt/Qwen2.5-7B STAGE1_DATA=stage_1.jsonl STAGE2_DATA=stage_2.jsonl INDEX=/idx/wiki18 \
#            bash train/scripts/r1searcher_qwen2.5-7b.sh
set -euo pipefail
MODEL_FAMILY=qwen R3RAG_WRAPPER="$0" exec bash "$(dirname "${BASH_SOURCE[0]}")/r1searcher.sh" "$@"

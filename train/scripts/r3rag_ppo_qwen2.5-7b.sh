#!/usr/bin/env bash
# R3-RAG PPO for qwen2.5-7b from its R3-RAG SFT checkpoint (POLICY=...); everything else, including
# the hardware assumed (one node of 8 x 80 GB GPUs; NNODES=N for more), is in r3rag_ppo.sh.
# Usage: POLICY=CKPT ... bash train/scripts/r3rag_ppo_qwen2.5-7b.sh [--help]   (the variables: r3rag_ppo.sh --help)
# Example: POLICY=/ckpt/r3rag-sft-qwen2.5-7b DATASET=hotpotqa_train_8192.jsonl INDEX=/idx/wiki18-e5 \
#            bash train/scripts/r3rag_ppo_qwen2.5-7b.sh
set -euo pipefail
MODEL_FAMILY=qwen R3RAG_WRAPPER="$0" exec bash "$(dirname "${BASH_SOURCE[0]}")/r3rag_ppo.sh" "$@"

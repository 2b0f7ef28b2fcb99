#!/usr/bin/env bash
# R3-RAG PPO for llama3.1-8b from its R3-RAG SFT checkpoint (POLICY=...); everything else, including
# the hardware assumed (one node of 8 x 80 GB GPUs; NNODES=N for more), is in r3rag_ppo.sh.
MODEL_FAMILY=llama exec bash "$(dirname "${BASH_SOURCE[0]}")/r3rag_ppo.sh" "$@"

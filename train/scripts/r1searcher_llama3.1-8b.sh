#!/usr/bin/env bash
# R1-Searcher, both stages (STAGE=1|2 for one), for llama3.1-8b (POLICY=...); everything else,
# including the hardware assumed (one node of 8 x 80 GB GPUs; NNODES=N for more), is in r1searcher.sh.
MODEL_FAMILY=llama exec bash "$(dirname "${BASH_SOURCE[0]}")/r1searcher.sh" "$@"

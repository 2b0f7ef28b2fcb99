#!/usr/bin/env bash
# R1-Searcher (arXiv 2503.05592) on stock OpenRLHF 0.11.2 + r3rag's agent plugin: two stages of
# Reinforce++ with a group baseline, outcome rewards only (no per-step hook needed, it stays on).
#
# Hardware assumed: one node of 8 x 80 GB GPUs (A100/H100) for a 7-8B policy; policy, reference
# (when KL > 0) and 8 vLLM engines colocated on every GPU (ZeRO-3, bf16, sleep mode). More
# nodes: NNODES=N after train/scripts/cluster_node.sh. Memory plan: docs/cluster.md.
#
# Recipe (the paper's): reinforce_baseline, 16 samples per prompt, lr 2e-6, KL 1e-4 (Llama) or 0
# (Qwen), temperature 1.0; tag format, 3 documents per query, up to 8 retrievals.
#   stage 1 (learn to call the tool): reward 0.5 retrieved + 0.5 valid format, 350 prompts;
#   stage 2 (learn to answer): answer F1, format penalty -2 (Qwen) / -1 (Llama), 8,148 prompts,
#   starting from stage 1's model.
# Not given by the paper, our choice: rollout batch 64 prompts (x16 = 1,024 samples), train batch 256,
# KL as a k2 loss term (OpenRLHF's recommendation for reinforce_baseline).
#
# Usage: POLICY=CKPT STAGE1_DATA=FILE STAGE2_DATA=FILE INDEX=DIR [MODEL_FAMILY=llama|qwen] [STAGE=1|2|both] \
#          bash train/scripts/r1searcher.sh [--help]
#   MODEL_FAMILY=llama|qwen (default: qwen)   STAGE=1|2|both (default: both)
#   STAGE=2 alone starts from STAGE2_POLICY (default: POLICY)
# Example:
#   POLICY=/ckpt/Qwen2.5-7B INDEX=indexes/wiki18-e5 bash train/scripts/r1searcher.sh
#   R3RAG_DRY_RUN=1 bash train/scripts/r1searcher.sh     # print the flags, start nothing
# The prompts default to R1-Searcher's published files in the repository, data/r1searcher/stage_1.jsonl
# (350) and stage_2.jsonl (8,148); STAGE1_DATA=... / STAGE2_DATA=... use others. Other knobs:
# train/scripts/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
r3rag_args "$@"

MODEL_FAMILY="${MODEL_FAMILY:-qwen}"
STAGE="${STAGE:-both}"
case "$MODEL_FAMILY" in
  llama) KL=1e-4; PENALTY=-1 ;;
  qwen) KL=0; PENALTY=-2 ;;
  *) r3rag_die "MODEL_FAMILY must be llama or qwen (got '$MODEL_FAMILY')" ;;
esac
case "$STAGE" in 1|2|both) ;; *) r3rag_die "STAGE must be 1, 2 or both (got '$STAGE')" ;; esac
BASE_SAVE="${SAVE_DIR:-runs/openrlhf/r1searcher-$MODEL_FAMILY}"
EPISODES="${EPISODES:-1}"
r3rag_check_numbers

run_stage() {  # STAGE_NUMBER DATASET POLICY
  local stage="$1"
  SAVE_DIR="$BASE_SAVE/stage$stage"; DATASET="$2"; POLICY="$3"; PROMPTS=""
  unset PROMPTS
  R3RAG_AGENT_CONFIG="r1searcher_stage$stage"
  R3RAG_AGENT_SET=""
  [ "$stage" = 2 ] && R3RAG_AGENT_SET="reward.overrides=[outcome.format_penalty=$PENALTY]"
  r3rag_inputs
  r3rag_common_args
  ARGS+=(
    --algo.advantage.estimator reinforce_baseline
    --actor.adam.lr 2e-6
    --algo.kl.init_coef "$KL" --algo.kl.use_loss --algo.kl.estimator k2
    --rollout.batch_size 64 --rollout.n_samples_per_prompt 16 --rollout.micro_batch_size 16
    --train.batch_size 256 --train.micro_batch_size 2 --train.max_epochs 1 --train.num_episodes "$EPISODES"
    --rollout.temperature 1.0 --rollout.top_p 1.0
    --data.max_len 8192
    --logger.wandb.run_name "r1searcher-$MODEL_FAMILY-stage$stage"
  )
  r3rag_run
}

STAGE1_DATA="${STAGE1_DATA:-$R3RAG_ROOT/data/r1searcher/stage_1.jsonl}"
STAGE2_DATA="${STAGE2_DATA:-$R3RAG_ROOT/data/r1searcher/stage_2.jsonl}"
if [ "$STAGE" = 1 ] || [ "$STAGE" = both ]; then
  [ "$R3RAG_DRY_RUN" = 1 ] || [ -n "${POLICY:-}" ] || r3rag_die "set POLICY to the base model stage 1 starts from"
  run_stage 1 "$STAGE1_DATA" "${POLICY:-/path/to/base-model}"
fi
if [ "$STAGE" = 2 ] || [ "$STAGE" = both ]; then
  STAGE2_POLICY="${STAGE2_POLICY:-}"
  if [ -z "$STAGE2_POLICY" ]; then
    if [ "$STAGE" = both ]; then STAGE2_POLICY="$BASE_SAVE/stage1/model"; else STAGE2_POLICY="${POLICY:-/path/to/stage1-model}"; fi
    [ "$R3RAG_DRY_RUN" = 1 ] || [ "$STAGE" = both ] || [ -n "${POLICY:-}" ] \
      || r3rag_die "set STAGE2_POLICY (or POLICY) to the stage-1 model stage 2 starts from"
  fi
  run_stage 2 "$STAGE2_DATA" "$STAGE2_POLICY"
fi

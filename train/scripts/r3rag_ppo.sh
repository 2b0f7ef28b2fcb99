#!/usr/bin/env bash
# R3-RAG RL (arXiv 2505.23794) on stock OpenRLHF 0.11.2 + r3rag's agent plugin and per-step hook.
#
# Hardware assumed: one node of 8 x 80 GB GPUs (A100/H100) for a 7-8B policy; the policy, the
# critic (same size), the reference and 8 vLLM engines share every GPU (colocated, ZeRO-3, bf16,
# vLLM sleeping while DeepSpeed trains). More nodes: NNODES=N after starting the cluster with
# train/scripts/cluster_node.sh. Memory plan: docs/cluster.md.
#
# Recipe (the paper's): PPO with GAE and a critic; actor lr 5e-7, critic lr 9e-6, initial KL 0.01;
# rollout batch 64 prompts x 4 samples; at most 5 steps, 2 new documents per step (at most 10 per
# trajectory, 512 characters each); outcome +2.0 and per-step process rewards, each step's reward
# on that step's last token (r3rag.train.openrlhf.per_step).
#
# Usage: POLICY=CKPT DATASET=FILE INDEX=DIR [MODEL_FAMILY=llama|qwen] bash train/scripts/r3rag_ppo.sh [--help]
#   MODEL_FAMILY=llama|qwen   picks the SFT defaults below (default: llama)
# Example:
#   POLICY=/ckpt/r3rag-sft-llama3.1-8b DATASET=data/hotpotqa_train_8192.jsonl INDEX=indexes/wiki18-e5 \
#     bash train/scripts/r3rag_ppo.sh
#   R3RAG_DRY_RUN=1 bash train/scripts/r3rag_ppo.sh     # print the flags, start nothing
# (data/hotpotqa_train_8192.jsonl: python -m r3rag.data.fetch train.) Every other knob is an
# environment variable: train/scripts/common.sh. The judge (the paper's
# process and fallback outcome judge) is an OpenAI-compatible server you run, e.g.
#   R3RAG_AGENT_SET_EXTRA="reward.overrides=[process.source=judge,answer.judge_fallback=true,judge.base_url=http://JUDGE:8001/v1]"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
r3rag_args "$@"

MODEL_FAMILY="${MODEL_FAMILY:-llama}"
case "$MODEL_FAMILY" in llama|qwen) ;; *) r3rag_die "MODEL_FAMILY must be llama or qwen (got '$MODEL_FAMILY')" ;; esac
SAVE_DIR="${SAVE_DIR:-runs/openrlhf/r3rag-ppo-$MODEL_FAMILY}"
R3RAG_AGENT_CONFIG="${R3RAG_AGENT_CONFIG:-r3rag_ppo}"
R3RAG_AGENT_SET="${R3RAG_AGENT_SET:-}"
EPISODES="${EPISODES:-1}"

r3rag_check_numbers
r3rag_inputs
r3rag_common_args
ARGS+=(
  --critic.num_nodes "$NNODES" --critic.num_gpus_per_node "$GPUS_PER_NODE"
  --algo.advantage.estimator gae --algo.advantage.gamma 1.0 --algo.advantage.lambd 0.95
  --actor.adam.lr 5e-7 --critic.adam.lr 9e-6
  --algo.kl.init_coef 0.01 --algo.kl.estimator k1
  --rollout.batch_size 64 --rollout.n_samples_per_prompt 4 --rollout.micro_batch_size 8
  --train.batch_size 64 --train.micro_batch_size 2 --train.max_epochs 1 --train.num_episodes "$EPISODES"
  --rollout.temperature 1.0 --rollout.top_p 1.0
  --data.max_len 4096
  --actor.eps_clip 0.2 --critic.value_clip 0.5
  --critic.save_value_network
  --logger.wandb.run_name "r3rag-ppo-$MODEL_FAMILY"
)
r3rag_run

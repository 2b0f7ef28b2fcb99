# shellcheck shell=bash
# Shared by the OpenRLHF launch scripts in this folder (sourced, never run). Everything a user
# may change is an environment variable with a default; nothing names a host or a path of ours.
#
#   POLICY            the SFT checkpoint to start from (HF folder or hub name)         [required]
#   DATASET           training questions: FlashRAG JSONL {id, question, golden_answers, metadata}
#                     or R1-Searcher {idx, question, answer}                             [required]
#   INDEX             retrieval index folder (tool/build_index.py) served on every node   [required
#                     unless R3RAG_RETRIEVER_URLS points at running replicas]
#   NNODES=1          nodes in the Ray cluster (this one included)
#   GPUS_PER_NODE=8   GPUs per node
#   VLLM_TP=1         tensor parallelism of each vLLM engine (engines = NNODES*GPUS_PER_NODE/VLLM_TP)
#   RETRIEVER_PORT=8100  port of each node's retrieval replica
#   RETRIEVER_HOST    address this node's replica binds: 127.0.0.1 on one node, this node's
#                     first address (hostname -I) on several
#   R3RAG_RETRIEVER_URLS  comma list of replica URLs (default: one per Ray node, from the cluster)
#   RAY_PORT=6379     Ray head port
#   SAVE_DIR          where checkpoints, logs and the prompts file go (default: runs/openrlhf/<recipe>)
#   OPENRLHF_PYTHON   OpenRLHF's interpreter (default: .venvs/openrlhf/bin/python, train/envs/openrlhf.sh)
#   CORE_PYTHON       r3rag's interpreter for the retrieval service (default: .venv/bin/python)
#   PRECISION=bf16    DeepSpeed's parameter dtype: bf16 (A100/H100 and newer: native bf16) or fp16
#                     (V100, T4: no native bf16; DeepSpeed scales the loss). OpenRLHF has no fp32.
#   EXTRA_ARGS        more train_ppo_ray flags, appended last (they win)
#   R3RAG_AGENT_SET_EXTRA  more plugin overrides (r3rag.train.openrlhf.config, ';'-separated),
#                     appended to the recipe's own
#   R3RAG_DRY_RUN=1   print the environment and the flags (one per line) and exit: nothing starts
#
# Usage: source it from a launch script, which then calls r3rag_args "$@" (its --help: the
#        script's header; any other argument: an error, since every setting is a variable above).
# Example, the first lines of a launch script:
#   set -euo pipefail
#   source common.sh    # as "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   r3rag_args "$@"
# and a recipe's flags without starting it: R3RAG_DRY_RUN=1 bash train/scripts/r3rag_ppo.sh

set -euo pipefail
R3RAG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OPENRLHF_PYTHON="${OPENRLHF_PYTHON:-$R3RAG_ROOT/.venvs/openrlhf/bin/python}"
CORE_PYTHON="${CORE_PYTHON:-$R3RAG_ROOT/.venv/bin/python}"
NNODES="${NNODES:-1}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
VLLM_TP="${VLLM_TP:-1}"
RETRIEVER_PORT="${RETRIEVER_PORT:-8100}"
RAY_PORT="${RAY_PORT:-6379}"
R3RAG_DRY_RUN="${R3RAG_DRY_RUN:-0}"
PRECISION="${PRECISION:-bf16}"
AGENT_FILE="$R3RAG_ROOT/r3rag/train/openrlhf/agent.py"

r3rag_die() { echo "$(basename "$0"): error: $*" >&2; exit 2; }

# A script's header comment (what it does, its usage and an example), for --help.
r3rag_header() { awk 'NR == 1 && /^#!/ {next} /^# shellcheck/ {next} /^#/ {sub(/^# ?/, ""); print; next} {exit}' "$1"; }

# A launch script's arguments: --help / -h prints its header (a wrapper's first, R3RAG_WRAPPER)
# and exits 0; any other argument is an error (the settings are environment variables).
r3rag_args() {
  local a
  for a in "$@"; do
    case "$a" in
      -h|--help)
        if [ -n "${R3RAG_WRAPPER:-}" ]; then r3rag_header "$R3RAG_WRAPPER"; echo; echo "It runs $(basename "$0"):"; echo; fi
        r3rag_header "$0"; exit 0 ;;
    esac
  done
  [ $# -eq 0 ] || r3rag_die "unknown argument '$1': every setting is an environment variable (see --help)"
}

# A program the run needs: say which and how to get it, before anything starts.
r3rag_need() {  # COMMAND WHAT-TO-DO
  command -v "$1" >/dev/null 2>&1 || [ -x "$1" ] || r3rag_die "$1 not found: $2"
}

# An existing path made absolute (Ray workers run elsewhere); anything else (a hub name) unchanged.
r3rag_abspath() {
  if [ -e "$1" ]; then (cd "$(dirname "$1")" && echo "$(pwd)/$(basename "$1")"); else echo "$1"; fi
}

r3rag_check_numbers() {
  local v
  for v in NNODES GPUS_PER_NODE VLLM_TP RETRIEVER_PORT RAY_PORT; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || r3rag_die "$v must be a positive integer (got '${!v}')"
  done
  case "$PRECISION" in bf16|fp16) ;; *) r3rag_die "PRECISION must be bf16 or fp16 (got '$PRECISION'; OpenRLHF has no fp32)" ;; esac
  (( NNODES * GPUS_PER_NODE % VLLM_TP == 0 )) || r3rag_die "NNODES*GPUS_PER_NODE must be a multiple of VLLM_TP"
  VLLM_ENGINES=$(( NNODES * GPUS_PER_NODE / VLLM_TP ))
}

r3rag_default_host() {
  if [ -n "${RETRIEVER_HOST:-}" ]; then echo "$RETRIEVER_HOST"
  elif [ "$NNODES" = 1 ]; then echo 127.0.0.1
  else hostname -I 2>/dev/null | awk '{print $1}'; fi
}

# Placeholders in a dry run: the flags are checked, not the files.
r3rag_inputs() {
  if [ "$R3RAG_DRY_RUN" = 1 ]; then
    POLICY="${POLICY:-/path/to/sft-checkpoint}"; DATASET="${DATASET:-/path/to/train.jsonl}"
    PROMPTS="${PROMPTS:-$SAVE_DIR/prompts.jsonl}"
    return
  fi
  [ -n "${POLICY:-}" ] || r3rag_die "set POLICY to the SFT checkpoint (see the header of $0)"
  [ -n "${DATASET:-}" ] || r3rag_die "set DATASET to the training questions JSONL"
  [ -f "$DATASET" ] || r3rag_die "DATASET=$DATASET: file not found"
  [ -x "$OPENRLHF_PYTHON" ] || r3rag_die "$OPENRLHF_PYTHON not found: run bash train/envs/openrlhf.sh"
  r3rag_need "$CORE_PYTHON" "r3rag's environment (.venv) or CORE_PYTHON=/path/to/python"
  mkdir -p "$SAVE_DIR"
  SAVE_DIR="$(r3rag_abspath "$SAVE_DIR")"; POLICY="$(r3rag_abspath "$POLICY")"; DATASET="$(r3rag_abspath "$DATASET")"
  [ -z "${INDEX:-}" ] || INDEX="$(r3rag_abspath "$INDEX")"
  PROMPTS="${PROMPTS:-$SAVE_DIR/prompts.jsonl}"
  "$CORE_PYTHON" "$R3RAG_ROOT/train/scripts/openrlhf_prompts.py" --dataset "$DATASET" --out "$PROMPTS"
}

# Ray: use the running cluster (bash train/scripts/cluster_node.sh head|worker), or start a
# one-node head here when NNODES=1.
r3rag_ray() {
  local ray="$(dirname "$OPENRLHF_PYTHON")/ray"
  if "$ray" status >/dev/null 2>&1; then
    local have
    have="$("$OPENRLHF_PYTHON" -c 'import ray; ray.init(address="auto", logging_level="ERROR"); print(sum(1 for n in ray.nodes() if n["Alive"]))' 2>/dev/null || echo 0)"
    [ "$have" -ge "$NNODES" ] || r3rag_die "the Ray cluster has $have node(s), NNODES=$NNODES: start the others with bash train/scripts/cluster_node.sh worker"
  elif [ "$NNODES" = 1 ]; then
    "$ray" start --head --port "$RAY_PORT" --num-gpus "$GPUS_PER_NODE" --disable-usage-stats
  else
    r3rag_die "no Ray cluster: run bash train/scripts/cluster_node.sh head here and ... worker on the other $((NNODES - 1)) node(s)"
  fi
}

# This node's retrieval replica (startup/server.sh), unless one already answers.
r3rag_replica() {
  local host url
  host="$(r3rag_default_host)"
  url="http://$host:$RETRIEVER_PORT"; [ "$host" = 0.0.0.0 ] && url="http://127.0.0.1:$RETRIEVER_PORT"
  r3rag_need curl "install curl (the replica's health check uses it)"
  if curl -sf -m 5 "$url/health" >/dev/null 2>&1; then echo "retrieval replica already up: $url"; return; fi
  [ -n "${INDEX:-}" ] || r3rag_die "set INDEX to the retrieval index folder (or R3RAG_RETRIEVER_URLS to running replicas)"
  PYTHON="$CORE_PYTHON" bash "$R3RAG_ROOT/startup/server.sh" --run-dir "${SAVE_DIR:-runs/openrlhf}/retrieval-$(hostname -s)" \
    --host "$host" --retriever-port "$RETRIEVER_PORT" --index "$INDEX"
}

# Every node's replica URL, from the Ray cluster (the plugin puts its own node's first).
r3rag_urls() {
  if [ -n "${R3RAG_RETRIEVER_URLS:-}" ]; then echo "$R3RAG_RETRIEVER_URLS"; return; fi
  if [ "$NNODES" = 1 ]; then echo "http://$(r3rag_default_host):$RETRIEVER_PORT"; return; fi
  "$OPENRLHF_PYTHON" - "$RETRIEVER_PORT" <<'PY'
import sys, ray
ray.init(address="auto", logging_level="ERROR")
print(",".join(f"http://{n['NodeManagerAddress']}:{sys.argv[1]}" for n in ray.nodes() if n["Alive"]))
PY
}

# Print (dry run) or run: OpenRLHF's trainer through our launcher (per-step reward hook).
r3rag_run() {
  if [ -n "${EXTRA_ARGS:-}" ]; then
    # shellcheck disable=SC2206 # EXTRA_ARGS is a list of flags on purpose
    ARGS+=($EXTRA_ARGS)
  fi
  [ -z "${R3RAG_AGENT_SET_EXTRA:-}" ] || R3RAG_AGENT_SET="${R3RAG_AGENT_SET:+$R3RAG_AGENT_SET;}$R3RAG_AGENT_SET_EXTRA"
  export R3RAG_AGENT_CONFIG R3RAG_AGENT_SET
  if [ "$R3RAG_DRY_RUN" = 1 ]; then
    echo "ENV R3RAG_AGENT_CONFIG=$R3RAG_AGENT_CONFIG"
    echo "ENV R3RAG_AGENT_SET=${R3RAG_AGENT_SET:-}"
    printf 'ARG %s\n' "${ARGS[@]}"
    return 0
  fi
  r3rag_ray
  r3rag_replica
  R3RAG_RETRIEVER_URLS="$(r3rag_urls)"
  export R3RAG_RETRIEVER_URLS
  echo "retrieval replicas: $R3RAG_RETRIEVER_URLS"
  mkdir -p "$SAVE_DIR"
  "$OPENRLHF_PYTHON" -m r3rag.train.openrlhf.launch "${ARGS[@]}" 2>&1 | tee -a "$SAVE_DIR/train.log"
}

# Flags every recipe shares: the cluster layout (all models and the vLLM engines colocated on
# every GPU, sleeping in turn), ZeRO-3, PRECISION (bf16), our agent plugin and the prompts file.
r3rag_common_args() {
  ARGS=(
    --actor.model_name_or_path "$POLICY"
    --actor.num_nodes "$NNODES" --actor.num_gpus_per_node "$GPUS_PER_NODE"
    --ref.num_nodes "$NNODES" --ref.num_gpus_per_node "$GPUS_PER_NODE"
    --vllm.num_engines "$VLLM_ENGINES" --vllm.tensor_parallel_size "$VLLM_TP"
    --vllm.gpu_memory_utilization 0.5 --vllm.enable_sleep --vllm.enable_prefix_caching
    --train.colocate_all --ds.enable_sleep
    --ds.zero_stage 3 --ds.param_dtype "$PRECISION" --actor.gradient_checkpointing_enable
    --train.agent_func_path "$AGENT_FILE"
    --data.prompt_dataset "$PROMPTS" --data.input_key question --data.label_key label
    --ckpt.output_dir "$SAVE_DIR/model" --ckpt.path "$SAVE_DIR/checkpoints"
    --ckpt.save_steps 20 --ckpt.save_hf --ckpt.load_enable
    --logger.tensorboard_dir "$SAVE_DIR/tensorboard"
  )
}

# Run rather than sourced: --help says what this file is; anything else is a mistake.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case "${1:-}" in
    -h|--help) r3rag_header "$0"; exit 0 ;;
    *) r3rag_die "this file is sourced by the launch scripts in train/scripts, not run (see --help)" ;;
  esac
fi

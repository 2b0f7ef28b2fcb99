#!/usr/bin/env bash
# Join this node to the training cluster: start Ray (head or worker) and this node's retrieval
# replica. Run it on every node before a launch script with NNODES>1.
#
# Usage: [INDEX=DIR] [HEAD_ADDR=ADDR] bash train/scripts/cluster_node.sh head|worker|stop [--help]
# Example:
#   node 0:  INDEX=/idx/wiki18-e5 bash train/scripts/cluster_node.sh head
#   node i:  INDEX=/idx/wiki18-e5 HEAD_ADDR=<node 0's address> bash train/scripts/cluster_node.sh worker
#   node 0:  NNODES=2 POLICY=... DATASET=... bash train/scripts/r3rag_ppo_llama3.1-8b.sh
#   any:     bash train/scripts/cluster_node.sh stop      (this node's Ray and replica)
#
# Hardware assumed: GPU nodes that reach each other on RAY_PORT and RETRIEVER_PORT, the same
# checkout path and environments on every node (a shared file system, or the same commands run on
# each), and the index on every node's local disk (docs/cluster.md sizes it). The replica binds
# this node's first address (RETRIEVER_HOST to change it) so the other nodes can fail over to it;
# the agent plugin tries its own node's replica first.
# Environment: INDEX, HEAD_ADDR (worker), RAY_PORT=6379, RETRIEVER_PORT=8100, RETRIEVER_HOST,
# GPUS_PER_NODE=8, SAVE_DIR (replica logs; default runs/openrlhf), OPENRLHF_PYTHON, CORE_PYTHON.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

case "${1:-}" in -h|--help) r3rag_header "$0"; exit 0 ;; esac
[ $# -le 1 ] || r3rag_die "one argument: head, worker or stop (see --help)"
ROLE="${1:-}"
NNODES=2  # a cluster node: the replica binds a routable address (RETRIEVER_HOST overrides)
SAVE_DIR="${SAVE_DIR:-runs/openrlhf}"
RAY="$(dirname "$OPENRLHF_PYTHON")/ray"
r3rag_check_numbers
case "$ROLE" in head|worker|stop) r3rag_need "$RAY" "OpenRLHF's environment (bash train/envs/openrlhf.sh) or OPENRLHF_PYTHON" ;; esac
case "$ROLE" in
  head)
    "$RAY" start --head --port "$RAY_PORT" --num-gpus "$GPUS_PER_NODE" --disable-usage-stats
    r3rag_replica ;;
  worker)
    [ -n "${HEAD_ADDR:-}" ] || r3rag_die "set HEAD_ADDR to the head node's address"
    "$RAY" start --address "$HEAD_ADDR:$RAY_PORT" --num-gpus "$GPUS_PER_NODE" --disable-usage-stats
    r3rag_replica ;;
  stop)
    "$RAY" stop || true
    bash "$R3RAG_ROOT/startup/server.sh" --stop --run-dir "$SAVE_DIR/retrieval-$(hostname -s)" ;;
  *) echo "usage: bash train/scripts/cluster_node.sh head|worker|stop  (see --help)" >&2; exit 2 ;;
esac

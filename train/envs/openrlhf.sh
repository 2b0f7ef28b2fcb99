#!/usr/bin/env bash
# Create OpenRLHF 0.11.2's own virtual environment (its pins conflict with the core .venv and with
# LLaMA-Factory's, so it never shares one).
#
# Usage: bash train/envs/openrlhf.sh [--cpu | --gpu] [--venv DIR] [--help]
# Examples:
#   bash train/envs/openrlhf.sh            # auto: GPU stack if nvidia-smi sees a GPU, else CPU
#   bash train/envs/openrlhf.sh --cpu      # force the CPU environment (CI, laptops)
#   bash train/envs/openrlhf.sh --gpu      # force the full GPU stack (cluster nodes)
#
# CPU: openrlhf==0.11.2 --no-deps, its pure-Python requirements pinned below (torch==2.13.0 CPU in
#      the same pip command), and the import stand-ins of train/envs/standins/ (flash_attn, vllm)
#      so that its agent API, argument parser, reward placement and advantage code import and run.
#      Its trainers do not run on CPU (its DeepSpeed strategy hard-codes CUDA).
# GPU: openrlhf[vllm]==0.11.2 (vLLM and torch at the versions OpenRLHF pins) and flash-attn 2.8.3
#      (built against that torch; needs nvcc), no stand-ins.
# Both: r3rag itself, --no-deps (editable, from this checkout).
#
# Idempotent: a stamp file in the venv records what was installed (a hash of this script, the
# pins and the stand-ins); a second run with nothing changed exits in well under a second.
# Environment: R3RAG_OPENRLHF_VENV (default: .venvs/openrlhf), PYTHON (default: python3, >= 3.10),
# R3RAG_OPENRLHF_MODE (auto | cpu | gpu; the flags win), PIP_ARGS (extra pip arguments).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${R3RAG_OPENRLHF_VENV:-$ROOT/.venvs/openrlhf}"
PYTHON="${PYTHON:-python3}"
MODE="${R3RAG_OPENRLHF_MODE:-auto}"
STANDINS="$ROOT/train/envs/standins"

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu; shift ;;
    --gpu) MODE=gpu; shift ;;
    --venv) [ $# -ge 2 ] || { echo "openrlhf.sh: error: --venv needs a path" >&2; exit 2; }; VENV="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "openrlhf.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$MODE" in
  auto) if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then MODE=gpu; else MODE=cpu; fi ;;
  cpu|gpu) ;;
  *) echo "openrlhf.sh: error: R3RAG_OPENRLHF_MODE must be auto, cpu or gpu (got '$MODE')" >&2; exit 2 ;;
esac

OPENRLHF="openrlhf==0.11.2"
# OpenRLHF 0.11.2's requirements that matter off-GPU, pinned at the versions pip resolved with torch
# 2.13.0 on 2026-11-30
# (transformers, deepspeed and ray are OpenRLHF's own pins). No flash-attn, vllm, bitsandbytes,
# pynvml: GPU-only.
CPU_PINS=(
  torch==2.13.0 transformers==5.15.0 deepspeed==0.19.6 "ray[default]==2.55.0"
  accelerate==1.15.0 datasets==5.2.0 einops==0.8.2 jsonlines==4.0.0 loralib==0.1.2 optimum==2.3.0
  peft==0.21.2 tensorboard==2.21.0 torchmetrics==1.9.0 tqdm==4.70.1 transformers-stream-generator==0.0.5
  wandb==0.31.0 pylatexenc==2.11 math-verify==0.9.0 sympy==1.14.0 aiohttp==3.14.5 torchdata==0.11.0
  wheel==0.48.0 packaging==26.4 optree==0.20.0 isort==9.0.2 huggingface-hub==1.33.0 grpcio==1.85.3
  httpx==0.28.1 pydantic==2.14.4 pyyaml==6.0.4 numpy==2.4.6
)
GPU_PKGS=("openrlhf[vllm]==0.11.2")
FLASH_ATTN="flash-attn==2.8.3"

key() {  # what was installed: this script's commands (not its comments), the mode, the stand-ins
  { grep -v '^[[:space:]]*#' "${BASH_SOURCE[0]}"; echo "$MODE"; [ "$MODE" = cpu ] && find "$STANDINS" -type f -name '*.py' | sort | xargs cat; } \
    | sha256sum | cut -c1-16
}
KEY="$(key)"
STAMP="$VENV/.r3rag-openrlhf-$MODE"
if [ -f "$STAMP" ] && [ "$(head -n1 "$STAMP")" = "$KEY" ]; then
  echo "openrlhf env: up to date at $VENV ($MODE; $(sed -n 2p "$STAMP"))"
  exit 0
fi

start=$(date +%s)
[ -x "$VENV/bin/python" ] || command -v "$PYTHON" >/dev/null 2>&1 \
  || { echo "openrlhf.sh: error: $PYTHON not found (set PYTHON=/path/to/python3.10+)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check ${PIP_ARGS:-})
"${PIP[@]}" --upgrade pip

if [ "$MODE" = cpu ]; then
  # torch pinned in the same command: an unpinned requirement would pull a multi-GB CUDA build
  "${PIP[@]}" --no-deps "$OPENRLHF"
  "${PIP[@]}" "${CPU_PINS[@]}"
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -rf "$VENV/r3rag-standins"
  cp -r "$STANDINS" "$VENV/r3rag-standins"
  echo "$VENV/r3rag-standins" > "$site/r3rag_standins.pth"
else
  "${PIP[@]}" "${GPU_PKGS[@]}"
  "${PIP[@]}" --no-build-isolation "$FLASH_ATTN"
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -f "$site/r3rag_standins.pth"
fi
"${PIP[@]}" --no-deps -e "$ROOT"

# the parts the CPU tests use must import
"$PY" - <<'PY'
import openrlhf.utils.agent, openrlhf.models.utils, openrlhf.trainer.ppo_utils.experience_maker  # noqa: F401
import r3rag.rollout.engine  # noqa: F401
PY

took=$(( $(date +%s) - start ))
printf '%s\n%s\n' "$KEY" "created $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${took}s" > "$STAMP"
echo "openrlhf env: created $VENV ($MODE) in ${took}s"

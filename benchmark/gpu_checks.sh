#!/usr/bin/env bash
# Every GPU check of the project in one script, for a machine with one CUDA GPU:
#   1. benchmark/gpu_training.py: world -> cold start -> SFT -> RL on the GPU at a larger batch,
#      held-out EM of SFT and RL with the paired 95% interval (WORK/summary.json);
#   2. the tests marked `gpu` (skipped on CPU machines: tests/test_rollout_hf_gpu.py and
#      tests/test_rl_learning.py::test_same_code_on_cuda).
#
#   bash benchmark/gpu_checks.sh [RESULTS_DIR] [-- extra flags for gpu_training.py]
#
# RESULTS_DIR (default: $OUT if set, else runs/gpu-checks) receives nvidia-smi.txt, versions.txt,
# gpu_training.log, summary.json, the RL metrics, curves and held-out predictions, pytest_gpu.txt.
# GPU_TRAINING_TIMEOUT (seconds, default 480; SIGINT, so the summary of what finished is still written)
# and GPU_TESTS_TIMEOUT (default 150) bound each part; GPU_CHECKS_TESTS=0 skips the tests.
set -u
cd "$(dirname "$0")/.."
RES="${OUT:-runs/gpu-checks}"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then RES="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
WORK="${GPU_TRAINING_WORK:-runs/gpu-training}"
PY="${PYTHON:-python3}"
mkdir -p "$RES"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

nvidia-smi > "$RES/nvidia-smi.txt" 2>&1
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name(0))" \
    > "$RES/versions.txt" 2>&1
cat "$RES/versions.txt"

start=$(date +%s)
timeout -s INT -k 20 "${GPU_TRAINING_TIMEOUT:-480}" "$PY" benchmark/gpu_training.py --work "$WORK" --device cuda "$@" \
    > "$RES/gpu_training.log" 2>&1
echo "gpu_training rc=$? in $(( $(date +%s) - start )) s"
grep "^\[gpu_training" "$RES/gpu_training.log" | tail -n 20
grep -E "Error|error:" "$RES/gpu_training.log" | tail -n 5
cp "$WORK/summary.json" "$WORK/rl/metrics.jsonl" "$RES/" 2>/dev/null
cp "$WORK"/rl/*.png "$RES/" 2>/dev/null
mkdir -p "$RES/rl_eval" && cp "$WORK"/rl/eval/*.jsonl "$RES/rl_eval/" 2>/dev/null

[ "${GPU_CHECKS_TESTS:-1}" = 0 ] && exit 0
start=$(date +%s)
timeout "${GPU_TESTS_TIMEOUT:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_rollout_hf_gpu.py tests/test_rl_learning.py > "$RES/pytest_gpu.txt" 2>&1
echo "pytest -m gpu rc=$? in $(( $(date +%s) - start )) s"
tail -n 3 "$RES/pytest_gpu.txt"

#!/usr/bin/env bash
# The GPU checks of the project in one script, for a machine with one CUDA GPU (no network, no vLLM).
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: bash benchmark/gpu_checks.sh [--tiny] [RESULTS_DIR] [-- FLAGS FOR benchmark/gpu_training.py]

On one H100 or H200 (6-9 minutes; docs/results/gpu_checks.md has the cost model and the sizing):
  1. checks that the project's python has CUDA torch and sees a GPU (exit 3 with one line if not);
  2. benchmark/gpu_training.py --device cuda: world -> cold start -> SFT -> RL (8 x 8 trajectories
     per iteration, 2 minutes) -> evaluation of the prompted base, SFT, RL and RL's null control on
     the same 300 held-out dev questions: SFT - base, RL - SFT and RL - null control with 95% intervals;
  3. with GPU_CHECKS_TESTS=1, the tests marked `gpu` (about 45 s more).
It stops at the first stage that fails (exit 1). RESULTS_DIR (default: $OUT if set, else
runs/gpu-checks) gets summary.txt (the figures; its LAST line is "pass" or "fail: ..."),
summary.json, versions.txt, nvidia-smi.txt, gpu_training.log, the RL metrics and curves.

  --tiny      the whole script on the CPU with a tiny random model (about a minute; CI runs it)
  -h, --help  this text

Environment: PYTHON (default: .venv/bin/python of the checkout), GPU_TRAINING_WORK (work folder,
default runs/gpu-training, runs/gpu-training-tiny with --tiny; a rerun reuses its finished stages),
GPU_TRAINING_TIMEOUT (seconds, default 540), GPU_CHECKS_TESTS (1: also run the gpu tests),
GPU_TESTS_TIMEOUT (default 150).

Examples:
  bash benchmark/gpu_checks.sh "$OUT"                          # on the lent GPU
  bash benchmark/gpu_checks.sh "$OUT" -- --rl-minutes 3        # a longer RL time box
  bash benchmark/gpu_checks.sh --tiny /tmp/gpu-checks-tiny     # the code path on a CPU
USAGE
}

TINY=0
RES=""
EXTRA=()
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --tiny) TINY=1; shift ;;
        --) shift; EXTRA=("$@"); break ;;
        -*) echo "gpu_checks: unknown option $1 (see --help)" >&2; exit 2 ;;
        *)
            if [ -n "$RES" ]; then echo "gpu_checks: one RESULTS_DIR only, got $RES and $1 (see --help)" >&2; exit 2; fi
            RES="$1"; shift ;;
    esac
done

cd "$(dirname "$0")/.."
RES="${RES:-${OUT:-runs/gpu-checks}}"
if [ -n "${PYTHON:-}" ]; then
    PY="$PYTHON"
elif [ -x .venv/bin/python ]; then
    PY=.venv/bin/python
else
    echo "gpu_checks: no project python: .venv/bin/python is missing and PYTHON is not set (see --help)" >&2
    exit 2
fi
mkdir -p "$RES"
SUMMARY="$RES/summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() { echo "fail: $1" >> "$SUMMARY"; echo "gpu_checks: fail: $1" >&2; exit "${2:-1}"; }  # MESSAGE [STATUS]
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

# 1. prerequisites: CUDA torch and a GPU (the tiny run is the CPU path: torch alone)
if ! "$PY" - "$TINY" > "$RES/versions.txt" 2>&1 <<'PYCHECK'
import sys
try:
    import torch, transformers
except ImportError as err:
    sys.exit(f"{sys.executable} cannot import {err.name}: not the project's environment (set PYTHON)")
print("python", sys.executable, "torch", torch.__version__, "cuda build", torch.version.cuda, "transformers", transformers.__version__)
if sys.argv[1] == "0":
    if torch.version.cuda is None:
        sys.exit(f"torch {torch.__version__} is a CPU-only build: no CUDA")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
    print("gpu", torch.cuda.get_device_name(0))
PYCHECK
then
    fail "prerequisites: $(tail -n 1 "$RES/versions.txt")" 3
fi
say "$(tail -n 1 "$RES/versions.txt")"
if [ "$TINY" = 0 ]; then
    nvidia-smi > "$RES/nvidia-smi.txt" 2>&1 || true
fi

# 2. world -> cold start -> SFT -> RL -> evaluation
if [ "$TINY" = 1 ]; then
    WORK="${GPU_TRAINING_WORK:-runs/gpu-training-tiny}"
    FLAGS=(--device cpu --tiny --threads 1 --bootstrap 200)
else
    WORK="${GPU_TRAINING_WORK:-runs/gpu-training}"
    FLAGS=(--device cuda)
fi
start=$(date +%s)
rc=0
timeout -s INT -k 20 "${GPU_TRAINING_TIMEOUT:-540}" "$PY" benchmark/gpu_training.py --work "$WORK" "${FLAGS[@]}" \
    ${EXTRA[@]+"${EXTRA[@]}"} > "$RES/gpu_training.log" 2>&1 || rc=$?
cp "$WORK/summary.json" "$RES/" 2>/dev/null || true
cp "$WORK/rl/metrics.jsonl" "$WORK/rl/eval_report.json" "$RES/" 2>/dev/null || true
cp "$WORK"/rl/*.png "$RES/" 2>/dev/null || true
grep "^\[gpu_training" "$RES/gpu_training.log" | tail -n 30 || true
if [ "$rc" != 0 ]; then
    why=$("$PY" -c 'import json,sys; f=json.load(open(sys.argv[1])).get("failed") or {}; print("stage %s: %s" % (f["stage"], f["error"]) if f else "")' \
          "$WORK/summary.json" 2>/dev/null || true)
    [ "$rc" = 124 ] || [ "$rc" = 130 ] && why="ran past GPU_TRAINING_TIMEOUT=${GPU_TRAINING_TIMEOUT:-540} s${why:+ ($why)}"
    [ -n "$why" ] || why="$(grep -v '^\[gpu_training' "$RES/gpu_training.log" | tail -n 1)"
    fail "gpu_training exited $rc after $(( $(date +%s) - start )) s: $why (log: $RES/gpu_training.log)"
fi
say "gpu_training: done in $(( $(date +%s) - start )) s"
"$PY" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1]))["figures"]))' "$WORK/summary.json" | tee -a "$SUMMARY"

# 3. the tests marked gpu (opt-in: they do not fit the 10-minute lease with the training)
if [ "${GPU_CHECKS_TESTS:-0}" = 1 ] && [ "$TINY" = 0 ]; then
    start=$(date +%s)
    rc=0
    timeout "${GPU_TESTS_TIMEOUT:-150}" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
        tests/test_rollout_hf_gpu.py tests/test_rl_learning.py > "$RES/pytest_gpu.txt" 2>&1 || rc=$?
    [ "$rc" = 0 ] || fail "pytest -m gpu exited $rc: $(tail -n 1 "$RES/pytest_gpu.txt")"
    say "pytest -m gpu: $(tail -n 1 "$RES/pytest_gpu.txt") in $(( $(date +%s) - start )) s"
fi
say "pass"

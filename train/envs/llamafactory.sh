#!/usr/bin/env bash
# Create LLaMA-Factory's own virtual environment (its pins on transformers, datasets and trl
# conflict with the core .venv and with OpenRLHF's), CPU-only, once.
#
# Usage: bash train/envs/llamafactory.sh [--force] [--help]
# Examples:
#   bash train/envs/llamafactory.sh            # creates .venvs/llamafactory (a stamp makes re-runs instant)
#   R3RAG_LLAMAFACTORY_VENV=/path bash train/envs/llamafactory.sh
#   bash train/envs/llamafactory.sh --force    # rebuild from scratch
#
# What it does, and why:
#   1. llamafactory==0.9.5 and torch==2.13.0 in ONE pip command: an unpinned torch requirement
#      would resolve to a multi-GB CUDA build.
#   2. PyPI's torchvision/torchaudio wheels that come along are CUDA builds that break imports on a
#      CPU machine: they are removed; LLaMA-Factory's data/mm_plugin.py imports torchaudio
#      unconditionally, so a stand-in module is written into site-packages (audio is unused).
#   3. r3rag itself is installed with --no-deps (editable) so the process LLaMA-Factory runs in can
#      import r3rag.train.sft (our template registration and launcher) and the contract test.
# It prints how long the creation took. Variables: PYTHON (interpreter, default python3),
# LLAMAFACTORY_SPEC, TORCH_SPEC.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${R3RAG_LLAMAFACTORY_VENV:-$ROOT/.venvs/llamafactory}"
PYTHON="${PYTHON:-python3}"
LLAMAFACTORY_SPEC="${LLAMAFACTORY_SPEC:-llamafactory==0.9.5}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
STAMP="$VENV/.r3rag-llamafactory-installed"

FORCE=0
for a in "$@"; do
    case "$a" in
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        --force) FORCE=1 ;;
        *) echo "llamafactory.sh: error: unknown option '$a' (see --help)" >&2; exit 2 ;;
    esac
done
if [[ "$FORCE" == 1 ]]; then
    rm -rf "$VENV"
fi
if [[ -f "$STAMP" ]]; then
    echo "llamafactory env: ready at $VENV ($(cat "$STAMP"))"
    exit 0
fi

command -v "$PYTHON" >/dev/null 2>&1 || { echo "llamafactory.sh: error: $PYTHON not found (set PYTHON=/path/to/python3.10+)" >&2; exit 2; }
start=$(date +%s)
mkdir -p "$(dirname "$VENV")"
# Keep the environments folder out of git whatever the repository's .gitignore says.
if [[ "$(dirname "$VENV")" == "$ROOT/.venvs" && ! -f "$ROOT/.venvs/.gitignore" ]]; then
    echo '*' > "$ROOT/.venvs/.gitignore"
fi
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "$TORCH_SPEC" "$LLAMAFACTORY_SPEC"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
mkdir -p "$SITE/torchaudio"
cat > "$SITE/torchaudio/__init__.py" <<'EOF'
"""Stand-in written by r3rag's train/envs/llamafactory.sh: LLaMA-Factory imports torchaudio
unconditionally (data/mm_plugin.py), PyPI's wheel is a CUDA build, and audio is never used here."""
__version__ = "0.0.0+r3rag.stub"


def __getattr__(name):
    raise ImportError(f"torchaudio.{name}: torchaudio is a stand-in in this environment (no audio support)")
EOF

"$PY" -m pip install -q --no-deps -e "$ROOT"
# Fail here, not in the first training run, if the environment does not import.
"$PY" - <<'EOF'
import torch, transformers, llamafactory
from llamafactory.data.template import TEMPLATES
from llamafactory.train.tuner import run_exp
import r3rag.train.sft.lf_template, r3rag.train.sft.lf_launch  # our template registration must import here
assert not torch.cuda.is_available() or True
print(f"llamafactory {llamafactory.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
took=$(( $(date +%s) - start ))
echo "created $(date -u +%Y-%m-%dT%H:%M:%SZ) in ${took}s" > "$STAMP"
echo "llamafactory env: created at $VENV in ${took}s"

#!/usr/bin/env bash
# Serve the r3rag demo page (Gradio) on 127.0.0.1:7860 by default, in the foreground (Ctrl-C stops it).
# Start the services first: bash startup/server.sh  (the page reads RUN_DIR/services.json).
#
# Usage: bash startup/startup_visualize.sh [--config FILE] [--set KEY=VALUE] [flags] [--help]
# Examples:
#   bash startup/startup_visualize.sh                          # SmolLM2-135M-Instruct on CPU, the world
#   bash startup/startup_visualize.sh --model /path/to/ckpt --device cuda     # a trained checkpoint on GPU
#   bash startup/startup_visualize.sh --backend openai --base-url http://127.0.0.1:8000 \
#        --model r3rag-policy --tokenizer /path/to/ckpt          # a vLLM server (server.sh --vllm-model)
#   bash startup/startup_visualize.sh --backend oracle         # the world's gold-decomposition policy
#   bash startup/startup_visualize.sh --help                   # every flag; --config FILE, --set KEY=VALUE
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="python3"; fi
fi
command -v "$PYTHON" >/dev/null 2>&1 \
  || { echo "startup_visualize.sh: error: $PYTHON not found (create .venv, or set PYTHON=/path/to/python)" >&2; exit 2; }
for a in "$@"; do
  case "$a" in  # the usage and examples above, then every flag of the page's program
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; echo; cd "$ROOT"; exec "$PYTHON" -m r3rag.demo.app --help ;;
  esac
done
has_config=0
for a in "$@"; do [ "$a" = "--config" ] && has_config=1; done
extra=()
[ "$has_config" = 1 ] || [ ! -f "$ROOT/configs/demo.yaml" ] || extra=(--config "$ROOT/configs/demo.yaml")
export GRADIO_ANALYTICS_ENABLED="${GRADIO_ANALYTICS_ENABLED:-False}"
cd "$ROOT"
exec "$PYTHON" -m r3rag.demo.app "${extra[@]}" "$@"

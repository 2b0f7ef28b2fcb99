#!/usr/bin/env bash
# Start what the r3rag demo needs, each as its own process with a log and a PID file:
#   - the retrieval service (tool/retrieval_server.py) over the embedded world's BM25 index,
#     built on first use, or over any index given with --index;
#   - optionally a model server (vLLM's OpenAI-compatible `vllm serve`) with --vllm-model.
# It waits until each answers its health check, writes RUN_DIR/services.json (read by
# startup/startup_visualize.sh) and prints the URLs. `--stop` stops exactly the processes it
# started, by the PIDs in RUN_DIR/pids/. Everything binds 127.0.0.1 unless --host says otherwise.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'EOF'
usage: bash startup/server.sh [options]        start the demo's services
       bash startup/server.sh --stop [--run-dir DIR]    stop them (by PID)
       bash startup/server.sh --status [--run-dir DIR]  show what runs

Services (each with a log in RUN_DIR/logs and a PID file in RUN_DIR/pids):
  retrieval service   the embedded world's BM25 index (built on first use), or --index DIR
  model server        only with --vllm-model: `vllm serve MODEL` (OpenAI-compatible; needs a GPU
                      machine with vllm installed). Without it the page runs the model in-process.

options:
  --run-dir DIR         logs, PID files, world, index, services.json (default: runs/demo)
  --host HOST           bind address for every service (default: 127.0.0.1)
  --retriever-port N    retrieval service port (default: 8100)
  --index DIR           serve this index (from tool/build_index.py) instead of the world's
  --dataset FILE        questions JSONL offered as examples on the page (default: the world's dev set)
  --world-size SIZE     embedded world size: tiny | small | medium | large (default: small)
  --world-seed N        embedded world seed (default: 0)
  --vllm-model MODEL    also start `vllm serve MODEL` (a folder or hub name) as the model server
  --model-port N        model server port (default: 8000)
  --served-model-name N name the model server answers to (default: r3rag-policy)
  --vllm-args "ARGS"    extra arguments for vllm serve, e.g. "--gpu-memory-utilization 0.5"
  --timeout S           seconds to wait for each health check (default: 600)
  --stop                stop the processes this script started (by PID) and exit
  --status              print each service's PID and health and exit
  -h, --help            this help

Environment: PYTHON (interpreter; default .venv/bin/python if present, else python3),
VLLM (the vllm command; default: vllm).

example:
  bash startup/server.sh                                   # the world's BM25 service on 127.0.0.1:8100
  bash startup/server.sh --index /idx/wiki18-e5 --vllm-model /ckpt/r3rag-sft --vllm-args "--gpu-memory-utilization 0.5"
  bash startup/server.sh --stop
EOF
}

RUN_DIR="runs/demo"
HOST="127.0.0.1"
RET_PORT=8100
INDEX=""
DATASET=""
WORLD_SIZE="small"
WORLD_SEED=0
VLLM_MODEL=""
MODEL_PORT=8000
SERVED_NAME="r3rag-policy"
VLLM_ARGS=""
TIMEOUT=600
ACTION="start"

die() { echo "server.sh: error: $*" >&2; exit 2; }
need_value() { [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value (see --help)"; }

while [ $# -gt 0 ]; do
  case "$1" in
    --run-dir) need_value "$@"; RUN_DIR="$2"; shift 2 ;;
    --host) need_value "$@"; HOST="$2"; shift 2 ;;
    --retriever-port) need_value "$@"; RET_PORT="$2"; shift 2 ;;
    --index) need_value "$@"; INDEX="$2"; shift 2 ;;
    --dataset) need_value "$@"; DATASET="$2"; shift 2 ;;
    --world-size) need_value "$@"; WORLD_SIZE="$2"; shift 2 ;;
    --world-seed) need_value "$@"; WORLD_SEED="$2"; shift 2 ;;
    --vllm-model) need_value "$@"; VLLM_MODEL="$2"; shift 2 ;;
    --model-port) need_value "$@"; MODEL_PORT="$2"; shift 2 ;;
    --served-model-name) need_value "$@"; SERVED_NAME="$2"; shift 2 ;;
    --vllm-args) need_value "$@"; VLLM_ARGS="$2"; shift 2 ;;
    --timeout) need_value "$@"; TIMEOUT="$2"; shift 2 ;;
    --stop) ACTION="stop"; shift ;;
    --status) ACTION="status"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

for n in "$RET_PORT" "$MODEL_PORT" "$WORLD_SEED" "$TIMEOUT"; do
  [[ "$n" =~ ^[0-9]+$ ]] || die "expected a number, got '$n'"
done
case "$WORLD_SIZE" in tiny|small|medium|large) ;; *) die "--world-size must be tiny, small, medium or large" ;; esac

if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON="python3"; fi
fi
VLLM="${VLLM:-vllm}"

if [ "$ACTION" != "start" ] && [ ! -d "$RUN_DIR" ]; then
  echo "nothing started from $RUN_DIR"; exit 0
fi
mkdir -p "$RUN_DIR"
RUN_DIR="$(cd "$RUN_DIR" && pwd)"
PID_DIR="$RUN_DIR/pids"
LOG_DIR="$RUN_DIR/logs"
# A client reaches a service bound to every interface through the loopback address.
URL_HOST="$HOST"; [ "$HOST" = "0.0.0.0" ] && URL_HOST="127.0.0.1"

# ---- process bookkeeping: RUN_DIR/pids/NAME.pid holds "PID" and, on line 2, the health URL ----
is_alive() {  # a zombie (exited, not yet reaped) counts as gone
  local pid="$1" state
  [ -e "/proc/$pid" ] || return 1
  state="$(awk '/^State:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
  [ -n "$state" ] && [ "$state" != "Z" ]
}

stop_one() {
  local file="$1" name pid
  name="$(basename "$file" .pid)"
  pid="$(head -n 1 "$file")"
  if [[ "$pid" =~ ^[0-9]+$ ]] && is_alive "$pid"; then
    # Each service was started as the leader of its own process group (setsid), so signalling the
    # group -PID reaches the workers it spawned too (vLLM's engine processes), and nothing else.
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do is_alive "$pid" || break; sleep 0.1; done
    if is_alive "$pid"; then
      kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do is_alive "$pid" || break; sleep 0.1; done
    fi
    echo "stopped $name (pid $pid)"
  else
    echo "$name (pid $pid) was not running"
  fi
  rm -f "$file"
}

stop_all() {
  local f found=0
  [ -d "$PID_DIR" ] || { echo "nothing to stop in $RUN_DIR"; return 0; }
  for f in "$PID_DIR"/*.pid; do
    [ -e "$f" ] || continue
    found=1; stop_one "$f"
  done
  [ "$found" = 1 ] || echo "nothing to stop in $RUN_DIR"
  rm -f "$RUN_DIR/services.json"
}

status_all() {
  local f pid url ok
  if ! compgen -G "$PID_DIR/*.pid" >/dev/null; then echo "no services started from $RUN_DIR"; return 0; fi
  for f in "$PID_DIR"/*.pid; do
    pid="$(head -n 1 "$f")"; url="$(sed -n 2p "$f")"
    ok="down"; curl -sf -m 5 "$url" >/dev/null 2>&1 && ok="healthy"
    is_alive "$pid" || ok="not running"
    printf '%-10s pid %-8s %-8s %s\n' "$(basename "$f" .pid)" "$pid" "$ok" "$url"
  done
}

start_service() {  # NAME HEALTH_URL CMD...
  local name="$1" url="$2"; shift 2
  local log="$LOG_DIR/$name.log"
  echo "starting $name: $*" >"$log"
  # setsid: the service leads its own process group (the PID is its group id), so --stop can end
  # it with everything it spawned, and a Ctrl-C in this terminal does not reach it.
  setsid "$@" >>"$log" 2>&1 </dev/null &
  local pid=$!
  printf '%s\n%s\n' "$pid" "$url" >"$PID_DIR/$name.pid"
  echo "$name: pid $pid, log $log"
}

wait_healthy() {  # NAME HEALTH_URL
  local name="$1" url="$2" pid deadline
  pid="$(head -n 1 "$PID_DIR/$name.pid")"
  deadline=$(( $(date +%s) + TIMEOUT ))
  while ! curl -sf -m 5 "$url" >/dev/null 2>&1; do
    if ! is_alive "$pid"; then
      echo "server.sh: $name exited before it became healthy; last lines of $LOG_DIR/$name.log:" >&2
      tail -n 20 "$LOG_DIR/$name.log" >&2 || true
      return 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "server.sh: $name did not answer $url within ${TIMEOUT}s (log: $LOG_DIR/$name.log)" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "$name is healthy: $url"
}

port_free() {  # HOST PORT: true when nothing listens there
  ! (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

case "$ACTION" in
  stop) stop_all; exit 0 ;;
  status) status_all; exit 0 ;;
esac

# ---- start -----------------------------------------------------------------------------------------
command -v curl >/dev/null || die "curl is needed for the health checks (apt-get install curl)"
command -v setsid >/dev/null || die "setsid (util-linux) is needed to start the services"
mkdir -p "$PID_DIR" "$LOG_DIR"
for f in "$PID_DIR"/*.pid; do
  [ -e "$f" ] || continue
  if is_alive "$(head -n 1 "$f")"; then
    die "$(basename "$f" .pid) from $RUN_DIR is already running; stop it first: bash startup/server.sh --stop --run-dir $RUN_DIR"
  fi
  rm -f "$f"
done
port_free "$URL_HOST" "$RET_PORT" || die "port $RET_PORT on $URL_HOST is in use; choose another with --retriever-port"
if [ -n "$VLLM_MODEL" ]; then
  port_free "$URL_HOST" "$MODEL_PORT" || die "port $MODEL_PORT on $URL_HOST is in use; choose another with --model-port"
  command -v "$VLLM" >/dev/null || die "'$VLLM' not found: install vllm on this (GPU) machine, or set VLLM=/path/to/vllm"
fi

on_failure() {
  echo "server.sh: start failed; stopping what was started" >&2
  stop_all >&2
}

cd "$ROOT"
if [ -z "$INDEX" ]; then
  WORLD="$RUN_DIR/world-$WORLD_SIZE-seed$WORLD_SEED"
  INDEX="$RUN_DIR/index-$WORLD_SIZE-seed$WORLD_SEED/bm25"
  if [ ! -f "$WORLD/manifest.json" ]; then
    echo "building the embedded world ($WORLD_SIZE, seed $WORLD_SEED) in $WORLD ..."
    "$PYTHON" data/build_world.py --out "$WORLD" --seed "$WORLD_SEED" --size "$WORLD_SIZE" --quiet
  fi
  if [ ! -f "$INDEX/manifest.json" ]; then
    echo "building the BM25 index in $INDEX ..."
    "$PYTHON" tool/build_index.py --corpus "$WORLD/corpus.jsonl" --method bm25 --out "$INDEX" --name world --quiet
  fi
  if [ -z "$DATASET" ]; then  # the dev set; the tiny world has none, so its train set then
    DATASET="$WORLD/dev.jsonl"; [ -s "$DATASET" ] || DATASET="$WORLD/train.jsonl"
  fi
fi
[ -f "$INDEX/manifest.json" ] || die "$INDEX: no manifest.json; build an index with tool/build_index.py"
[ -z "$DATASET" ] || [ -f "$DATASET" ] || die "$DATASET: dataset file not found"

RET_URL="http://$URL_HOST:$RET_PORT"
start_service retriever "$RET_URL/health" \
  "$PYTHON" tool/retrieval_server.py --index "$INDEX" --host "$HOST" --port "$RET_PORT"
MODEL_URL=""
if [ -n "$VLLM_MODEL" ]; then
  MODEL_URL="http://$URL_HOST:$MODEL_PORT"
  # shellcheck disable=SC2086 # VLLM_ARGS is a list of extra arguments on purpose
  start_service model "http://$URL_HOST:$MODEL_PORT/health" \
    "$VLLM" serve "$VLLM_MODEL" --host "$HOST" --port "$MODEL_PORT" --served-model-name "$SERVED_NAME" $VLLM_ARGS
fi

wait_healthy retriever "$RET_URL/health" || { on_failure; exit 1; }
# One query before the page's first: BM25's numba kernels compile on first use (seconds).
curl -sf -m "$TIMEOUT" -X POST "$RET_URL/retrieve" -H 'content-type: application/json' \
  -d '{"queries": ["warm up"], "topk": 1, "return_scores": true}' >/dev/null \
  || { echo "server.sh: no answer to a warm-up query (log: $LOG_DIR/retriever.log)" >&2; on_failure; exit 1; }
if [ -n "$MODEL_URL" ]; then
  wait_healthy model "http://$URL_HOST:$MODEL_PORT/health" || { on_failure; exit 1; }
fi

"$PYTHON" - "$RUN_DIR/services.json" "$RET_URL" "$INDEX" "$DATASET" "$MODEL_URL" "$SERVED_NAME" "$VLLM_MODEL" <<'PYEOF'
import json, sys
path, ret, index, dataset, model_url, served, weights = sys.argv[1:]
info = {"retriever_url": ret, "index": index, "dataset": dataset or None}
if model_url:  # the page tokenizes locally with the served model's own tokenizer
    info.update(model_base_url=model_url, model=served, tokenizer=weights)
with open(path, "w", encoding="utf-8") as fh:
    json.dump(info, fh, indent=2)
PYEOF

echo
echo "retrieval service: $RET_URL   (index: $INDEX)"
[ -z "$MODEL_URL" ] || echo "model server:      $MODEL_URL   (model: $SERVED_NAME)"
[ -z "$DATASET" ] || echo "dataset:           $DATASET"
echo "services:          $RUN_DIR/services.json"
echo "next:              bash startup/startup_visualize.sh --run-dir $RUN_DIR"
echo "stop:              bash startup/server.sh --stop --run-dir $RUN_DIR"

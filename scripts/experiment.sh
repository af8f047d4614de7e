#!/usr/bin/env bash
# The experiment of docs/experiment.md: colocated versus 1P1D on the same 2 cores, the same
# model (qwen2.5-0.5b preset), the same prompts, swept over request rates by
# `pdserve bench sweep`; the runs, summaries and plots land in OUT_DIR (docs/experiment).
#
#   colocated: `pdserve router` + one `pdserve serve --role colocated --threads 2` on cores 0,1
#              (chunked prefill: --max-batch-tokens tokens of prefill per step, mixed with decode)
#   1p1d:      `pdserve up --prefill 1 --decode 1 --fabric-provider shm` (P on core 0, D on
#              core 1, the router on both)
# `pdserve up --nodes 1` is not used for colocated: it keeps a core for its router whenever
# there are more cores than nodes, which would leave the node one core of the two.
#
# Everything is a variable (defaults in brackets):
#   EXPERIMENT_SCALE [1]  multiplies NUM_PROMPTS (the run time scales with it)
#   NUM_PROMPTS [6]       timed requests per rate and deployment, before scaling
#   RATES [0.025,0.05,0.075,0.1]  request rates (req/s); the last should saturate both
#   INPUT_LEN [1536] RANGE_RATIO [0.25] OUTPUT_LEN [128]  prompt and output tokens
#   GOODPUT ["itl:1000"]  SLOs of the goodput plot (ttft/tpot/itl/e2el:MS)
#   CDF_RATE [0.05]       rate of the ITL CDF plot
#   PRESET [qwen2.5-0.5b] WORK_DIR [$XDG_CACHE_HOME/pdserve]  the model, made once there
#   OUT_DIR [docs/experiment] DEPLOYMENTS ["colocated 1p1d"] BUILD [build]
#   ADMISSION [serve's default]  the decode node's --admission (local | refuse | off;
#                         docs/messenger.md, "Admission")
#   NAME_SUFFIX [""]      appended to the deployment names of the runs (e.g. -admission-off),
#                         so that runs of two settings can share OUT_DIR
#   EXPERIMENT_SMOKE=1    a minute-long check of the pipeline: the tiny preset, short prompts,
#                         2 rates, 3 prompts, into /tmp (measures nothing)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
PDSERVE=${PDSERVE:-$BUILD/src/cli/pdserve}
if [ "${EXPERIMENT_SMOKE:-0}" = 1 ]; then
  : "${PRESET:=tiny}" "${NUM_PROMPTS:=3}" "${RATES:=2,inf}" "${INPUT_LEN:=48}"
  : "${OUTPUT_LEN:=12}" "${CDF_RATE:=2}" "${OUT_DIR:=/tmp/pdserve-experiment-smoke}"
fi
SCALE=${EXPERIMENT_SCALE:-1}
NUM_PROMPTS=$(( ${NUM_PROMPTS:-6} * SCALE ))
RATES=${RATES:-0.025,0.05,0.075,0.1}
INPUT_LEN=${INPUT_LEN:-1536}
RANGE_RATIO=${RANGE_RATIO:-0.25}
OUTPUT_LEN=${OUTPUT_LEN:-128}
GOODPUT=${GOODPUT:-itl:1000}
CDF_RATE=${CDF_RATE:-0.05}
PRESET=${PRESET:-qwen2.5-0.5b}
WORK_DIR=${WORK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pdserve}
OUT_DIR=${OUT_DIR:-docs/experiment}
DEPLOYMENTS=${DEPLOYMENTS:-colocated 1p1d}
MODEL=$WORK_DIR/$PRESET
LOGS=$WORK_DIR/experiment-logs

[ -x "$PDSERVE" ] || { echo "experiment: no $PDSERVE; run make build first" >&2; exit 1; }
mkdir -p "$WORK_DIR" "$LOGS" "$OUT_DIR"
if [ ! -f "$MODEL/config.json" ]; then
  echo "experiment: making the $PRESET model in $MODEL (once)"
  "$PDSERVE" make-model --preset "$PRESET" --out "$MODEL.tmp.$$"
  mv "$MODEL.tmp.$$" "$MODEL"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  PIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM  # the EXIT trap then stops the processes

# Waits until one completion through the router succeeds (every node loaded and ready).
wait_ready() {
  local url=$1 deadline=$((SECONDS + 900))
  while [ $SECONDS -lt $deadline ]; do
    if curl -sf -m 30 "$url/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "Hello", "max_tokens": 1}' >/dev/null 2>&1; then
      return 0
    fi
    for pid in "${PIDS[@]}"; do
      kill -0 "$pid" 2>/dev/null || { echo "experiment: a process exited; see $LOGS" >&2; return 1; }
    done
    sleep 1
  done
  echo "experiment: $url not ready in time" >&2
  return 1
}

start_colocated() {
  local node_port; node_port=$(free_port)
  taskset -c 0,1 "$PDSERVE" serve --role colocated --model "$MODEL" --threads 2 \
    --listen "127.0.0.1:$node_port" >"$LOGS/colocated-node.log" 2>&1 &
  PIDS+=($!)
  "$PDSERVE" router --listen "127.0.0.1:$PORT" --node "http://127.0.0.1:$node_port" \
    >"$LOGS/colocated-router.log" 2>&1 &
  PIDS+=($!)
}

start_1p1d() {
  if ! "$PDSERVE" up --help 2>/dev/null | grep -q -- '--prefill'; then
    echo "experiment: *** this pdserve has no 'up --prefill/--decode': 1p1d SKIPPED ***" >&2
    return 2
  fi
  "$PDSERVE" up --model "$MODEL" --prefill 1 --decode 1 --fabric-provider shm \
    --local-prefill-max-tokens 0 ${ADMISSION:+--admission "$ADMISSION"} \
    --port "$PORT" >"$LOGS/1p1d-up.log" 2>&1 &
  PIDS+=($!)
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "model: $PRESET; prompts $INPUT_LEN tokens (range ratio $RANGE_RATIO), output $OUTPUT_LEN"
  echo "rates: $RATES; $NUM_PROMPTS prompts per rate; goodput SLO: $GOODPUT"
  echo "1p1d admission: ${ADMISSION:-local, the default}"
} >"$OUT_DIR/machine.txt"

for deployment in $DEPLOYMENTS; do
  PORT=$(free_port)
  echo "experiment: === $deployment on 127.0.0.1:$PORT ==="
  rc=0
  "start_$deployment" || rc=$?
  [ $rc -eq 2 ] && continue
  [ $rc -eq 0 ] || exit 1
  wait_ready "http://127.0.0.1:$PORT"
  if [ "$deployment" = 1p1d ]; then
    # The decode node answers before its prefill node is up (it prefills by itself meanwhile):
    # wait for the handshake, so that the warm-up goes through P (and P measures its prefill
    # rate, which D's admission needs) before the timed requests.
    for _ in $(seq 600); do
      grep -q "prefill peer .* ready" "$LOGS/1p1d-up.log" && break
      sleep 1
    done
  fi
  # shellcheck disable=SC2086  # GOODPUT holds several NAME:MS words
  "$PDSERVE" bench sweep --deployment "$deployment${NAME_SUFFIX:-}=http://127.0.0.1:$PORT" \
    --model "$(curl -sf "http://127.0.0.1:$PORT/v1/models" |
               python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')" \
    --rates "$RATES" --dataset random --random-input-len "$INPUT_LEN" \
    --random-range-ratio "$RANGE_RATIO" --random-output-len "$OUTPUT_LEN" \
    --num-prompts "$NUM_PROMPTS" --num-warmups 1 --seed 0 --goodput $GOODPUT \
    --request-timeout 3600 --result-dir "$OUT_DIR" --no-plots --disable-progress
  stop_all
done

echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT_DIR/machine.txt"
"$PDSERVE" bench sweep --plot-only --result-dir "$OUT_DIR" --cdf-rate "$CDF_RATE"
echo "experiment: done; results in $OUT_DIR (sweep.csv, plots/), logs in $LOGS"

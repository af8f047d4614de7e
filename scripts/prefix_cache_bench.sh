#!/usr/bin/env bash
# The prefix-caching figures of docs/benchmarks.md ("Prefix caching: multi-turn TTFT and KV
# bytes"): a colocated node and a 1P1D pair (two `pdserve serve` processes over libfabric shm),
# each with prefix caching on and off (--no-prefix-caching). Against each deployment, for each
# seed: a random-dataset baseline whose prompts are as long as one later turn's new tokens
# (answer + user message), then the multi-turn dataset; both at the same concurrency, seeds
# differing between repeats so no repeat hits another's prompts. Writes one vllm-style JSON per
# run into OUT and prints a summary (scripts/prefix_cache_summary.py).
#
#   scripts/prefix_cache_bench.sh MODEL_DIR OUT_DIR [PDSERVE]
# Knobs (environment): SEEDS, CONVERSATIONS, TURNS, SYSTEM, USER_MSG, ANSWER, OUTPUT, CONCURRENCY,
# DEPLOYMENTS (any of colocated-on colocated-off 1p1d-on 1p1d-off), PORT_BASE.
set -euo pipefail

MODEL=${1:?model directory}
OUT=${2:?output directory}
PDSERVE=${3:-build/src/cli/pdserve}
SEEDS=${SEEDS:-"1 2 3"}
CONVERSATIONS=${CONVERSATIONS:-8}
TURNS=${TURNS:-4}
SYSTEM=${SYSTEM:-512}
USER_MSG=${USER_MSG:-64}
ANSWER=${ANSWER:-64}
OUTPUT=${OUTPUT:-32}
CONCURRENCY=${CONCURRENCY:-2}
DEPLOYMENTS=${DEPLOYMENTS:-"colocated-on colocated-off 1p1d-on 1p1d-off"}
PORT_BASE=${PORT_BASE:-18470}
KEY=prefix-cache-bench
mkdir -p "$OUT"

PIDS=()
stop_nodes() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_nodes EXIT

wait_ready() {  # URL
  for _ in $(seq 1 600); do
    if curl -sf "$1/health" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  echo "no /health from $1" >&2
  return 1
}

bench() {  # NAME URL METRICS_ARGS... -- BENCH_ARGS...
  local name=$1 url=$2
  shift 2
  local metrics=()
  while [[ $1 != -- ]]; do metrics+=(--metrics-url "$1"); shift; done
  shift
  "$PDSERVE" bench serve --base-url "$url" --model m --tokenizer "$MODEL" \
    --max-concurrency "$CONCURRENCY" --output-len "$OUTPUT" --disable-progress \
    "${metrics[@]}" --result-file "$OUT/$name.json" "$@" > "$OUT/$name.txt"
}

for deployment in $DEPLOYMENTS; do
  caching=()
  [[ $deployment == *-off ]] && caching=(--no-prefix-caching)
  if [[ $deployment == colocated-* ]]; then
    "$PDSERVE" serve --role colocated --model "$MODEL" --served-model-name m --threads 2 \
      --listen 127.0.0.1:$PORT_BASE "${caching[@]}" > "$OUT/$deployment.node.log" 2>&1 &
    PIDS+=($!)
    url=http://127.0.0.1:$PORT_BASE
    metrics=("$url")
  else
    p=http://127.0.0.1:$((PORT_BASE + 1))
    "$PDSERVE" serve --role prefill --model "$MODEL" --served-model-name m --threads 1 \
      --listen 127.0.0.1:$((PORT_BASE + 1)) --cluster-key $KEY --fabric-provider shm \
      "${caching[@]}" > "$OUT/$deployment.prefill.log" 2>&1 &
    PIDS+=($!)
    "$PDSERVE" serve --role decode --model "$MODEL" --served-model-name m --threads 1 \
      --listen 127.0.0.1:$((PORT_BASE + 2)) --cluster-key $KEY --fabric-provider shm \
      --prefill-peer 127.0.0.1:$((PORT_BASE + 1)) "${caching[@]}" \
      > "$OUT/$deployment.decode.log" 2>&1 &
    PIDS+=($!)
    wait_ready "$p"
    url=http://127.0.0.1:$((PORT_BASE + 2))
    metrics=("$p" "$url")
  fi
  wait_ready "$url"
  # Untimed: first-touch of the weights and buffers at both prompt sizes, on prompts no timed
  # run shares.
  bench "$deployment-warmup-long" "$url" "${metrics[@]}" -- --dataset random \
    --random-input-len $((SYSTEM + TURNS * (USER_MSG + ANSWER))) --num-prompts 2 --seed 1000
  bench "$deployment-warmup-short" "$url" "${metrics[@]}" -- --dataset random \
    --random-input-len $((USER_MSG + ANSWER)) --num-prompts "$CONVERSATIONS" --seed 1001
  for seed in $SEEDS; do
    echo "$(date -u +%T) $deployment seed $seed (load $(cut -d' ' -f1-3 /proc/loadavg))"
    bench "$deployment-random-$seed" "$url" "${metrics[@]}" -- --dataset random \
      --random-input-len $((USER_MSG + ANSWER)) --num-prompts "$CONVERSATIONS" --seed "$seed"
    bench "$deployment-multiturn-$seed" "$url" "${metrics[@]}" -- --dataset multi-turn \
      --num-conversations "$CONVERSATIONS" --num-turns "$TURNS" --system-prompt-len "$SYSTEM" \
      --user-len "$USER_MSG" --answer-len "$ANSWER" --seed "$seed"
  done
  stop_nodes
done
echo "$(date -u +%T) done (load $(cut -d' ' -f1-3 /proc/loadavg))"

#!/usr/bin/env bash
# A disaggregated cluster on "hosts" of this machine, for trying membership on etcd
# (docs/architecture.md, "Membership"): each host is a network namespace joined to one bridge
# by a veth pair and runs its own processes; etcd runs on host 1, prefill nodes on the next
# hosts, decode nodes after them, and the router in this namespace on 127.0.0.1. Nothing is
# wired by hand: every node registers in etcd, decode nodes find the prefill nodes there and
# the router finds the decode nodes. Needs root (ip netns), etcd (Debian's etcd-server) and a
# built pdserve.
#
#   scripts/hosts-up.sh up --model DIR [--prefill N] [--decode N] [--port 8000] [--ttl 10]
#   scripts/hosts-up.sh add-prefill --model DIR     # one more prefill host while it serves
#   scripts/hosts-up.sh cut K | restore K           # cut host K's link (ip link set down) / back
#   scripts/hosts-up.sh members                     # what etcd lists
#   scripts/hosts-up.sh down                        # stops everything, removes the hosts
#
# Logs and state in ${PDSERVE_HOSTS_DIR:-/tmp/pdserve-hosts}. Without a model directory, make
# a tiny one: build/src/cli/pdserve make-model --preset tiny --out /tmp/tiny
set -euo pipefail

DIR=${PDSERVE_HOSTS_DIR:-/tmp/pdserve-hosts}
PDSERVE=${PDSERVE:-$(cd "$(dirname "$0")/.." && pwd)/build/src/cli/pdserve}
SUBNET=10.218.0
BRIDGE=pdhostsbr
PREFIX=/pdserve-hosts
KEY=${PDSERVE_CLUSTER_KEY:-hosts-up-secret}
export PDSERVE_CLUSTER_KEY=$KEY

die() { echo "hosts-up: $*" >&2; exit 1; }
ns() { echo "pdhost$1"; }
etcd_url() { echo "http://$SUBNET.1:2379"; }

make_host() {  # k
  local k=$1 n
  n=$(ns "$k")
  ip netns add "$n"
  ip link add "pdhb$k" type veth peer name "pdhn$k"
  ip link set "pdhn$k" netns "$n"
  ip link set "pdhb$k" master $BRIDGE
  ip link set "pdhb$k" up
  ip -n "$n" addr add "$SUBNET.$k/24" dev "pdhn$k"
  ip -n "$n" link set "pdhn$k" up
  ip -n "$n" link set lo up
  echo "$k" >> "$DIR/hosts"
}

start_node() {  # k role model ttl
  local k=$1 role=$2 model=$3 ttl=$4 extra=()
  [ "$role" = decode ] && extra=(--local-prefill-max-tokens 0)
  ip netns exec "$(ns "$k")" "$PDSERVE" serve --role "$role" --model "$model" \
    --listen "$SUBNET.$k:8000" --fabric-provider tcp --fabric-address "$SUBNET.$k" \
    --etcd "$(etcd_url)" --etcd-prefix $PREFIX --etcd-ttl-s "$ttl" "${extra[@]}" \
    > "$DIR/host$k-$role.out" 2> "$DIR/host$k-$role.log" &
  echo $! > "$DIR/host$k.pid"
  echo "host $k ($SUBNET.$k): $role node, log $DIR/host$k-$role.log"
}

next_host() { if [ -f "$DIR/hosts" ]; then echo $(( $(sort -n "$DIR/hosts" | tail -1) + 1 )); else echo 1; fi; }

cmd_up() {
  local model="" prefill=1 decode=1 port=8000 ttl=10
  while [ $# -gt 0 ]; do
    case $1 in
      --model) model=$2; shift 2 ;;
      --prefill) prefill=$2; shift 2 ;;
      --decode) decode=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      --ttl) ttl=$2; shift 2 ;;
      *) die "unknown flag $1" ;;
    esac
  done
  [ -n "$model" ] || die "--model DIR is needed"
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
  command -v etcd > /dev/null || die "etcd is not installed (apt-get install etcd-server)"
  [ -x "$PDSERVE" ] || die "no pdserve at $PDSERVE (build it, or set PDSERVE)"
  [ ! -e "$DIR/hosts" ] || die "a cluster is up already ($DIR): scripts/hosts-up.sh down"
  mkdir -p "$DIR"
  echo "$model" > "$DIR/model"
  echo "$ttl" > "$DIR/ttl"
  ip link add $BRIDGE type bridge
  ip addr add "$SUBNET.254/24" dev $BRIDGE
  ip link set $BRIDGE up
  make_host 1
  ip netns exec "$(ns 1)" etcd --name hosts --data-dir "$DIR/etcd" \
    --listen-client-urls "$(etcd_url)" --advertise-client-urls "$(etcd_url)" \
    --listen-peer-urls "http://$SUBNET.1:2380" --initial-advertise-peer-urls "http://$SUBNET.1:2380" \
    --initial-cluster "hosts=http://$SUBNET.1:2380" > "$DIR/etcd.log" 2>&1 &
  echo $! > "$DIR/etcd.pid"
  echo "host 1 ($SUBNET.1): etcd at $(etcd_url)"
  local k=2 i
  for ((i = 0; i < prefill; i++, k++)); do make_host $k; start_node $k prefill "$model" "$ttl"; done
  for ((i = 0; i < decode; i++, k++)); do make_host $k; start_node $k decode "$model" "$ttl"; done
  "$PDSERVE" router --listen "127.0.0.1:$port" --etcd "$(etcd_url)" --etcd-prefix $PREFIX \
    > "$DIR/router.out" 2> "$DIR/router.log" &
  echo $! > "$DIR/router.pid"
  echo "router: http://127.0.0.1:$port (log $DIR/router.log)"
  echo "waiting for the router to have a healthy decode node..."
  for _ in $(seq 1 120); do
    if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then
      echo "up. try:"
      echo "  curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \\"
      echo "    -d '{\"prompt\": \"Hello\", \"max_tokens\": 8}'"
      return 0
    fi
    sleep 1
  done
  die "the router has no healthy node after 120 s: see $DIR/*.log"
}

cmd_add_prefill() {
  [ -f "$DIR/hosts" ] || die "no cluster is up"
  local model k
  model=$(cat "$DIR/model")
  [ "${1:-}" = "--model" ] && model=$2
  k=$(next_host)
  make_host "$k"
  start_node "$k" prefill "$model" "$(cat "$DIR/ttl")"
}

cmd_members() {
  ETCDCTL_API=3 etcdctl --endpoints "$(etcd_url)" get --prefix "$PREFIX/members/" --print-value-only
}

cmd_down() {
  for f in "$DIR"/router.pid "$DIR"/host*.pid "$DIR"/etcd.pid; do
    [ -f "$f" ] && kill "$(cat "$f")" 2> /dev/null || true
  done
  sleep 1
  if [ -f "$DIR/hosts" ]; then
    while read -r k; do ip netns del "$(ns "$k")" 2> /dev/null || true; done < "$DIR/hosts"
  fi
  ip link del $BRIDGE 2> /dev/null || true
  rm -rf "$DIR"
  echo "down"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  add-prefill) shift; cmd_add_prefill "$@" ;;
  cut) ip link set "pdhb$2" down ;;
  restore) ip link set "pdhb$2" up ;;
  members) cmd_members ;;
  down) cmd_down ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac

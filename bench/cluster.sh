#!/usr/bin/env bash
# The limiter's throughput on one Redis server vs a three-master Redis
# Cluster (README, "TLS, Sentinel, Cluster"): private servers on loopback
# TCP, runs alternated, medians; see bench/cluster.rs.
# Usage: bench/cluster.sh [ADDRESSES] [REPS]   (default 10000 5)
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESSES=${1:-10000}
REPS=${2:-5}
cargo bench --no-run --bench cluster
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
start() { # dir port [args...]
  local dir=$1 port=$2; shift 2
  mkdir -p "$dir"
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" "$@" >/dev/null &
  pids+=($!)
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.05; done
  echo "redis-server on $port did not start" >&2; exit 1
}
single=$(free_port); start "$work/single" "$single"
nodes=()
for i in 0 1 2; do
  # the bus port explicitly: port + 10000 may not exist
  p=$(free_port); start "$work/node$i" "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port "$(free_port)"
  nodes+=("127.0.0.1:$p")
done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
for _ in $(seq 200); do
  redis-cli -p "${nodes[0]#*:}" cluster info | grep -q cluster_state:ok && break; sleep 0.05
done
echo "machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $ADDRESSES addresses"
urls=$(printf 'redis://%s,' "${nodes[@]}")
cargo bench -q --bench cluster -- "redis://127.0.0.1:$single" "${urls%,}" "$ADDRESSES" "$REPS"

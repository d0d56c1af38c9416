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
source bench/redis-servers.sh
start_single_and_cluster
echo "machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $ADDRESSES addresses"
urls=$(printf 'redis://127.0.0.1:%s,' "${nodes[@]}")
cargo bench -q --bench cluster -- "redis://127.0.0.1:$single" "${urls%,}" "$ADDRESSES" "$REPS"

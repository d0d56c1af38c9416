#!/usr/bin/env bash
# What each limiter costs in Redis (README, "Choosing an algorithm"): bytes per
# tracked address and pipelined script calls/s, against a private
# redis-server on a unix socket. One run; see bench/limiters.rs.
# Usage: bench/limiters.sh [ADDRESSES]   (default 10000)
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESSES=${1:-10000}
cargo bench --no-run --bench limiters
work=$(mktemp -d)
cleanup() { [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
redis-server --port 0 --unixsocket "$work/redis.sock" --save '' --appendonly no --dir "$work" >/dev/null &
rpid=$!
for _ in $(seq 100); do redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
echo "machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), zset-max-listpack-entries $(redis-cli -s "$work/redis.sock" config get zset-max-listpack-entries | tail -1), $ADDRESSES addresses"
cargo bench -q --bench limiters -- "unix://$work/redis.sock" "$ADDRESSES"

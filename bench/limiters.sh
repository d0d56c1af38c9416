#!/usr/bin/env bash
# What each limiter costs in Redis (README, "Choosing an algorithm"): bytes per
# tracked address and pipelined script calls/s, against a private
# redis-server on a unix socket. See bench/limiters.rs.
# Usage: bench/limiters.sh [ADDRESSES] [REPS] [ALGORITHM...]   (defaults
# 10000, 1, every algorithm; ALGORITHM: a part of its name, e.g. fixed)
# Env: EXE_OLD=/path/to/another build's limiters program (`bench/exe.sh
# limiters` in a checkout of the previous commit, copied aside): each
# repetition then runs this tree's and that one, alternating, each on a
# fresh server; every table is headed by its repetition and build.
set -euo pipefail
cd "$(dirname "$0")/.."
ADDRESSES=${1:-10000}
REPS=${2:-1}
shift $(( $# < 2 ? $# : 2 ))
ONLY=("$@")
EXE_NEW=$(bench/exe.sh limiters)
work=$(mktemp -d)
rpid=
cleanup() { [ -n "$rpid" ] && kill "$rpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
one() { # build-name exe
  redis-server --port 0 --unixsocket "$work/redis.sock" --save '' --appendonly no --dir "$work" >/dev/null &
  rpid=$!
  for _ in $(seq 100); do redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
  echo "### $1, repetition $r, zset-max-listpack-entries $(redis-cli -s "$work/redis.sock" config get zset-max-listpack-entries | tail -1)"
  "$2" "unix://$work/redis.sock" "$ADDRESSES" "${ONLY[@]}"
  kill "$rpid"; wait "$rpid" 2>/dev/null || true; rpid=
}
echo "machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $ADDRESSES addresses, load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$REPS"); do
  one new "$EXE_NEW"
  if [ -n "${EXE_OLD:-}" ]; then one old "$EXE_OLD"; fi
done

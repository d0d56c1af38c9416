#!/usr/bin/env bash
# The decision endpoint alone (GET /check over its unix socket), one run:
# `fleetban run` (release build) with BANS active bans in a private
# redis-server, its threads pinned to CPU 0 (DAEMON_CPU), the client on
# CPU 1: CONNS kept-alive connections in a closed loop, RUN_SECONDS per run,
# RUNS runs; checks/s and client-side p50/p99 per run, the median rate,
# and the daemon's own latency histogram.
# The harness is bench/http.rs (a [[bench]] target; never part of the suite).
# Usage: bench/http.sh [CONNS] [BANS]   (defaults 8, 100000)
# Env: RUN_SECONDS (5), RUNS (5), DAEMON_CPU (0), CLIENT_CPU (1).
# BENCH=flood: checks as nginx's pool asks them (POOL, PAUSE_MS), without
# and then with FLOOD (2000) slow and idle connections (bench/http.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
export CONNS=${1:-8} BANS=${2:-100000}
export RUN_SECONDS=${RUN_SECONDS:-5} RUNS=${RUNS:-5} DAEMON_CPU=${DAEMON_CPU:-0}
harness=$(bench/exe.sh http)
echo "machine: $(nproc) cores, $(uname -r); load average $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c "${CLIENT_CPU:-1}" "$harness" "${BENCH:-checks}"

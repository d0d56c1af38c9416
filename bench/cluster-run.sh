#!/usr/bin/env bash
# `fleetban run` end to end on one Redis server vs a three-master Redis
# Cluster (BENCHMARKS.md, "Redis Cluster"), the same daemon build and
# generated lines (the shipped rule nginx-scraper, as bench/compare.sh part
# 4): lines/s until every hit is decided, and Redis CPU per hit summed over
# the masters (INFO CPU before and after). Private servers on loopback TCP;
# runs alternate between the two topologies; medians of REPS.
# Usage: bench/cluster-run.sh [LINES] [REPS]   (defaults 1000000 3)
# Env: CLIENTS (50000), REDIS_OPTS (more keys of the daemons' `redis:` section).
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-1000000}
REPS=${2:-3}
CLIENTS=${CLIENTS:-50000}
cargo build --release --bin fleetban >/dev/null
BIN=$PWD/target/release/fleetban
GEN=$(bench/exe.sh loggen)
work=$(mktemp -d)
pids=()
dpid=""
cleanup() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
source bench/redis-servers.sh
start_single_and_cluster
sed -e "s#/var/log/nginx/access.log#$work/access.log#" rules/nginx-scraper.yaml > "$work/rules.yaml"
# Redis CPU seconds summed over the given ports.
redis_cpu_s() {
  for p in "$@"; do redis-cli -p "$p" info cpu; done |
    awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.3f", s}'
}
# One run on topology $1 (single|cluster): prints "lines_per_s redis_us_per_hit hits".
run_once() {
  local topo=$1 i=$2 ports redis
  if [ "$topo" = single ]; then
    ports=("$single")
    redis="url: \"redis://127.0.0.1:$single\""
  else
    ports=("${nodes[@]}")
    redis="cluster: [$(printf '"redis://127.0.0.1:%s", ' "${nodes[@]}" | sed 's/, $//')]"
  fi
  for p in "${ports[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
  local d="$work/$topo$i"
  mkdir -p "$d"
  : > "$d/access.log"
  sed -e "s#$work/access.log#$d/access.log#" "$work/rules.yaml" > "$d/rules.yaml"
  printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/run.sock\nredis: { %s%s }\nfirewall: { backend: log }\n' \
    "$d" "$d" "$redis" "${REDIS_OPTS:+, $REDIS_OPTS}" > "$d/run.yaml"
  "$GEN" --lines "$LINES" --clients "$CLIENTS" --start-ms "$(($(date +%s%3N) - 5000))" --per-second 1000000 > "$d/live.log"
  RUST_LOG=warn "$BIN" run -c "$d/run.yaml" 2> "$d/run.err" &
  dpid=$!
  for _ in $(seq 200); do [ -S "$d/run.sock" ] && break; sleep 0.05; done
  sleep 1
  local r0 t0 t1 r1
  r0=$(redis_cpu_s "${ports[@]}")
  t0=$(date +%s%N)
  cat "$d/live.log" >> "$d/access.log"
  for _ in $(seq 12000); do
    read -r lines pend < <("$BIN" status -c "$d/run.yaml" --json | python3 -c \
      'import json,sys; s=json.load(sys.stdin); print(s["lines"], s["redis"]["held_hits"] + s["redis"]["inflight_hits"])')
    [ "$lines" -ge "$LINES" ] && [ "$pend" -eq 0 ] && break
    sleep 0.02
  done
  t1=$(date +%s%N)
  r1=$(redis_cpu_s "${ports[@]}")
  "$BIN" status -c "$d/run.yaml" --json > "$d/status.json"
  kill "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=""
  python3 - "$d/status.json" "$t0" "$t1" "$r0" "$r1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); secs = (int(sys.argv[3]) - int(sys.argv[2])) / 1e9
hits = sum(r["hits"] for r in s["rules"])
print(f"{s['lines'] / secs:.0f}", f"{1e6 * (float(sys.argv[5]) - float(sys.argv[4])) / max(hits, 1):.2f}", hits)
PY
}
echo "machine: $(nproc) cores, $(redis-server --version | cut -d' ' -f3), $LINES lines, $CLIENTS clients, medians of $REPS"
for i in $(seq "$REPS"); do
  run_once single "$i" >> "$work/single.res"
  run_once cluster "$i" >> "$work/cluster.res"
done
ls=$(cut -d' ' -f1 "$work/single.res" | median); cs=$(cut -d' ' -f2 "$work/single.res" | median)
lc=$(cut -d' ' -f1 "$work/cluster.res" | median); cc=$(cut -d' ' -f2 "$work/cluster.res" | median)
echo "| fleetban run, end to end | lines/s | Redis CPU µs per hit (sum over masters) |"
echo "|---|---|---|"
echo "| one server | $ls | $cs |"
echo "| cluster of 3 masters | $lc | $cc |"
awk -v a="$lc" -v b="$ls" -v c="$cc" -v d="$cs" 'BEGIN {printf "ratios cluster / one server: lines/s %.2f, CPU per hit %.2f\n", a / b, c / d}'
echo "runs (lines/s, µs/hit, hits): single: $(tr '\n' ';' < "$work/single.res") cluster: $(tr '\n' ';' < "$work/cluster.res")"

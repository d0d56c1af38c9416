#!/usr/bin/env bash
# Whole-process benchmark of following a log (follow + split + parse + rules +
# Redis) with `fleetban run` against a private redis-server, one run:
#  1. LINES lines appended to the log while the daemon runs: lines/s (wall
#     time until `status` counts them all) and the daemon's CPU seconds.
#  2. A backlog 10x larger appended at once: the daemon's RSS sampled every
#     0.5 s while it catches up (min / median / max): memory stays flat
#     because reading pauses while the pipeline is busy (bounded channel).
# Usage: bench/follow.sh [LINES]   (default 1000000; needs ~22x LINES*200 bytes in $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-1000000}
BIG=$((LINES * 10))
cargo build --release --bin fleetban >/dev/null
BIN=$PWD/target/release/fleetban
GEN=$(bench/exe.sh loggen)
work=$(mktemp -d)
cleanup() { [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null; [ -n "${dpid:-}" ] && kill "$dpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

lines_read() { "$BIN" status -c "$work/run.yaml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/${1:-$dpid}/stat"; }
rss_mib() { awk '/VmRSS/ {print int($2/1024)}' "/proc/$dpid/status"; }
wait_lines() { # $1: total lines; samples RSS into $2 if given
  for _ in $(seq 36000); do
    [ "$(lines_read)" -ge "$1" ] && return 0
    [ -n "${2:-}" ] && rss_mib >> "$2"
    sleep 0.5
  done
  echo "timed out waiting for $1 lines" >&2; exit 1
}

echo "machine: $(nproc) cores, $(uname -r)"
redis-server --port 0 --unixsocket "$work/redis.sock" --save '' --appendonly no --dir "$work" >/dev/null &
rpid=$!
for _ in $(seq 100); do redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
sed -e "s#/var/log/nginx/access.log#$work/access.log#" rules/nginx-scraper.yaml > "$work/rules.yaml"
printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/run.sock\nredis: { url: "unix://%s/redis.sock" }\nfirewall: { backend: log }\n' \
  "$work" "$work" "$work" > "$work/run.yaml"
now=$(date +%s%3N)
# Times must be current (`run` skips hits older than the window).
"$GEN" --lines "$LINES" --start-ms "$((now - 5000))" --per-second 1000000 --seed 1 > "$work/a.log"
"$GEN" --lines "$BIG" --start-ms "$((now - 5000))" --per-second 1000000 --seed 2 > "$work/b.log"
: > "$work/access.log"
RUST_LOG=warn "$BIN" run -c "$work/run.yaml" 2> "$work/run.err" &
dpid=$!
for _ in $(seq 200); do [ -S "$work/run.sock" ] && break; sleep 0.05; done
sleep 0.3

echo "== $LINES lines appended while the daemon runs"
c0=$(cpu_ticks); r0=$(cpu_ticks "$rpid"); t0=$(date +%s%N)
cat "$work/a.log" >> "$work/access.log"
wait_lines "$LINES"
t1=$(date +%s%N); c1=$(cpu_ticks); r1=$(cpu_ticks "$rpid")
hz=$(getconf CLK_TCK)
awk -v n="$LINES" -v t="$(( (t1 - t0) / 1000000 ))" -v c="$((c1 - c0))" -v r="$((r1 - r0))" -v hz="$hz" -v rss="$(rss_mib)" \
  'BEGIN {printf "wall %.2f s => %.0f lines/s; daemon CPU %.2f s (%.0f lines per CPU second), redis-server CPU %.2f s; RSS %d MiB\n", t/1000, n/(t/1000), c/hz, n/(c/hz), r/hz, rss}'

echo "== backlog of $BIG lines appended at once"
: > "$work/rss"
t0=$(date +%s%N)
cat "$work/b.log" >> "$work/access.log" &
wait_lines "$((LINES + BIG))" "$work/rss"
t1=$(date +%s%N)
sort -n "$work/rss" | awk -v t="$(( (t1 - t0) / 1000000 ))" -v n="$BIG" \
  '{a[NR]=$1} END {printf "caught up in %.1f s (%.0f lines/s); RSS over %d samples: min %d, median %d, max %d MiB\n", t/1000, n/(t/1000), NR, a[1], a[int((NR+1)/2)], a[NR]}'
echo "daemon warnings/errors in its log: $(grep -c 'WARN\|ERROR' "$work/run.err" || true)"
grep 'WARN\|ERROR' "$work/run.err" | head -3 || true

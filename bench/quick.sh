#!/usr/bin/env bash
# Whole-process benchmarks, one run, medians of N repetitions:
#  1. `fleetban test` on a generated log (parse + match + decide): lines/s, CPU s
#  2. `fleetban run` against a private redis-server: lines/s end to end and
#     Redis round trips per 1,000 hits, with the log appended while it runs.
# Usage: bench/quick.sh [LINES] [REPS]   (defaults 1000000, 3)
# Env: BIN=/path/to/fleetban measures that build instead of this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-1000000}
REPS=${2:-3}
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin fleetban >/dev/null
  BIN=$PWD/target/release/fleetban
fi
GEN=$(bench/exe.sh loggen)
work=$(mktemp -d)
cleanup() { [ -n "${rpid:-}" ] && kill "$rpid" 2>/dev/null; [ -n "${dpid:-}" ] && kill "$dpid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "machine: $(nproc) cores, $(awk '/MemTotal/ {print int($2/1024/1024)" GiB"}' /proc/meminfo), $(uname -r)"
"$GEN" --lines "$LINES" > "$work/replay.log"
sed -e "s#/var/log/nginx/access.log#$work/access.log#" rules/nginx-scraper.yaml > "$work/rules.yaml"
printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/control.sock\n' "$work" "$work" > "$work/test.yaml"

echo "== fleetban test, $LINES lines, rule nginx-scraper"
for i in $(seq "$REPS"); do
  /usr/bin/time -f "%e %U %S" -o "$work/t" "$BIN" test -c "$work/test.yaml" "$work/replay.log" > /dev/null
  read -r wall user sys < "$work/t"
  echo "$wall $user $sys" >> "$work/test.times"
done
w=$(cut -d' ' -f1 "$work/test.times" | median); u=$(cut -d' ' -f2 "$work/test.times" | median)
echo "median wall ${w}s, user ${u}s => $(awk -v n="$LINES" -v w="$w" 'BEGIN {printf "%.0f", n/w}') lines/s"
echo "floor: wc -l $(/usr/bin/time -f "%e s" wc -l < "$work/replay.log" 2>&1 | tr '\n' ' ')"

echo "== fleetban run against redis-server (unix socket), $LINES lines appended"
redis-server --port 0 --unixsocket "$work/redis.sock" --save '' --appendonly no --dir "$work" >/dev/null &
rpid=$!
for _ in $(seq 100); do redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
# The log's times must be current: `run` skips hits older than the window.
"$GEN" --lines "$LINES" --start-ms "$(($(date +%s%3N) - 5000))" --per-second 1000000 > "$work/live.log"
: > "$work/access.log"
printf 'rules: [rules.yaml]\nstate_dir: %s/state-run\ncontrol: %s/run.sock\nredis: { url: "unix://%s/redis.sock" }\nfirewall: { backend: log }\n' \
  "$work" "$work" "$work" > "$work/run.yaml"
RUST_LOG=warn "$BIN" run -c "$work/run.yaml" 2> "$work/run.err" &
dpid=$!
for _ in $(seq 200); do [ -S "$work/run.sock" ] && break; sleep 0.05; done
t0=$(date +%s%N)
cat "$work/live.log" >> "$work/access.log"
for _ in $(seq 6000); do
  n=$("$BIN" status -c "$work/run.yaml" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["lines"])')
  [ "$n" -ge "$LINES" ] && break
  sleep 0.05
done
t1=$(date +%s%N)
"$BIN" status -c "$work/run.yaml" --json > "$work/status.json"
python3 - "$work/status.json" "$LINES" "$t0" "$t1" "$dpid" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); n = int(sys.argv[2]); secs = (int(sys.argv[4]) - int(sys.argv[3])) / 1e9
hits = sum(r["hits"] for r in s["rules"]); rt = s["redis"]["round_trips"]
rss = int(open(f"/proc/{sys.argv[5]}/status").read().split("VmRSS:")[1].split()[0]) // 1024
print(f"lines {s['lines']} in {secs:.2f}s => {s['lines']/secs:.0f} lines/s end to end (includes polling of status)")
print(f"hits {hits}, Redis round trips {rt} => {1000*rt/max(hits,1):.1f} round trips per 1,000 hits; bans {s['bans']}")
print(f"daemon RSS {rss} MB")
PY

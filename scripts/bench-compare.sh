#!/usr/bin/env bash
# The comparative benchmark (issue 7, BENCHMARKS.md): one run, one generated
# log, medians of REPS repetitions, one table at the end.
#  1. `fleetban test` with the shipped rule nginx-scraper: lines/s, CPU s
#  2. the floor: `wc -l` on the same file
#  3. `fail2ban-regex` (Debian's fail2ban) with a filter counting every request,
#     on a prefix of the same file (F2B_LINES)
#  4. `fleetban run` against a private redis-server (unix socket): lines/s end
#     to end and Redis round trips per 1,000 hits, and the same with the
#     hidden baseline `run --bench-one-call-per-hit` (one EVALSHA per hit, no
#     pipeline; on a prefix, BASE_LINES); daemon RSS idle and after the run
#  5. nft: 100,000 bans at start, bans one by one on top, RSS with them
#     (tests/bench_fleet.rs through scripts/bench-fleet.sh; root, namespaces)
#  6. Redis memory per tracked address (scripts/bench-limiters.sh)
# Usage: scripts/bench-compare.sh [LINES] [REPS]   (defaults 1000000, 3)
# Env: CLIENTS (50000), F2B_LINES (200000), BASE_LINES (50000), RUN_LINES
# (LINES; more lines make the <= redis.hold wait after the last one weigh less), SKIP_NFT=1,
# ONLY_RUN=1 (part 4 alone, for quick iterations on the Redis path),
# RSS_LATER=SECS (print the daemon's RSS again SECS after each run).
set -euo pipefail
cd "$(dirname "$0")/.."
LINES=${1:-1000000}
REPS=${2:-3}
CLIENTS=${CLIENTS:-50000}
F2B_LINES=${F2B_LINES:-200000}
BASE_LINES=${BASE_LINES:-50000}
RUN_LINES=${RUN_LINES:-$LINES}
if ! command -v fail2ban-regex >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y fail2ban >/dev/null
fi
cargo build --release --bin fleetban --example loggen >/dev/null
BIN=$PWD/target/release/fleetban
GEN=$PWD/target/release/examples/loggen
work=$(mktemp -d)
rpid="" dpid=""
cleanup() {
  [ -n "$dpid" ] && kill "$dpid" 2>/dev/null
  [ -n "$rpid" ] && kill "$rpid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# CPU seconds (user + system) of a process, and of the redis-server.
cpu_s() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$1/stat"; }
evalsha_calls() { redis-cli -s "$work/redis.sock" info commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' | grep . || echo 0; }
redis_cpu_s() { redis-cli -s "$work/redis.sock" info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.2f", s}'; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }
row() { printf '| %-58s | %14s | %s\n' "$1" "$2" "$3" >> "$work/table"; }

echo "machine: $(nproc) cores, $(awk -F': *' '/model name/ {print $2; exit}' /proc/cpuinfo)," \
  "$(awk '/MemTotal/ {print int($2/1024/1024)" GiB"}' /proc/meminfo), $(uname -r)"
echo "versions: $("$BIN" --version), $(redis-server --version | cut -d' ' -f3), $(nft --version)," \
  "fail2ban $(fail2ban-regex --version 2>&1 | head -1 | awk '{print $NF}')"
"$GEN" --lines "$LINES" --clients "$CLIENTS" > "$work/replay.log"
echo "input: $LINES lines, $CLIENTS clients, $(du -m "$work/replay.log" | cut -f1) MB (examples/loggen.rs)"
sed -e "s#/var/log/nginx/access.log#$work/access.log#" rules/nginx-scraper.yaml > "$work/rules.yaml"
printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/control.sock\n' "$work" "$work" > "$work/test.yaml"
: > "$work/table"

if [ "${ONLY_RUN:-0}" != 1 ]; then
# 1 and 2: the same file, the page cache warm for both.
cat "$work/replay.log" > /dev/null
for _ in $(seq "$REPS"); do
  /usr/bin/time -f "%e %U %S" -o "$work/t" "$BIN" test -c "$work/test.yaml" "$work/replay.log" > /dev/null
  cat "$work/t" >> "$work/test.times"
  /usr/bin/time -f "%e %U %S" -o "$work/t" wc -l "$work/replay.log" > /dev/null
  cat "$work/t" >> "$work/wc.times"
done
tw=$(cut -d' ' -f1 "$work/test.times" | median)
tc=$(awk '{print $2 + $3}' "$work/test.times" | median)
test_lps=$(awk -v n="$LINES" -v w="$tw" 'BEGIN {printf "%.0f", n / w}')
row "fleetban test (parse+match+decide), nginx-scraper" "$test_lps" "wall ${tw} s, CPU ${tc} s, $LINES lines"
ww=$(cut -d' ' -f1 "$work/wc.times" | median)
row "floor: wc -l" "$(awk -v n="$LINES" -v w="$ww" 'BEGIN {printf "%.0f", n / (w > 0 ? w : 0.005)}')" \
  "wall ${ww} s (time(1) resolution 10 ms)"

# 3: fail2ban-regex, a filter whose failregex matches every request.
head -n "$F2B_LINES" "$work/replay.log" > "$work/f2b.log"
printf '[Definition]\nfailregex = ^<HOST> \\S+ \\S+ \\[\ndatepattern = %%%%d/%%%%b/%%%%Y:%%%%H:%%%%M:%%%%S %%%%z\n' > "$work/f2b.conf"
for _ in $(seq "$REPS"); do
  /usr/bin/time -f "%e %U %S" -o "$work/t" fail2ban-regex --print-no-missed "$work/f2b.log" "$work/f2b.conf" > "$work/f2b.out"
  cat "$work/t" >> "$work/f2b.times"
done
grep -q "^Lines: $F2B_LINES lines, 0 ignored, $F2B_LINES matched" "$work/f2b.out" \
  || { echo "fail2ban-regex did not match every line:"; tail -3 "$work/f2b.out"; exit 1; }
fw=$(cut -d' ' -f1 "$work/f2b.times" | median)
f2b_lps=$(awk -v n="$F2B_LINES" -v w="$fw" 'BEGIN {printf "%.0f", n / w}')
row "fail2ban-regex, filter matching every request" "$f2b_lps" "wall ${fw} s, $F2B_LINES-line prefix, all matched"
row "  ratio fleetban test / fail2ban-regex" "$(awk -v a="$test_lps" -v b="$f2b_lps" 'BEGIN {printf "%.0fx", a / b}')" ""
fi

# 4: fleetban run end to end against a private redis-server.
redis-server --port 0 --unixsocket "$work/redis.sock" --save '' --appendonly no --dir "$work" >/dev/null &
rpid=$!
for _ in $(seq 100); do redis-cli -s "$work/redis.sock" ping >/dev/null 2>&1 && break; sleep 0.05; done
# One run: a fresh Redis and state, the daemon idle, then N lines appended at
# once with current times (`run` skips hits older than the window).
# Prints "lines secs lines_per_s trips_per_1000 hits bans rss_idle rss_after
# daemon_cpu_s redis_cpu_s calls_per_1000_hits" (CPU used while the lines
# were processed; script calls counted by Redis's commandstats).
run_once() {
  local n=$1 extra=$2 i=$3
  redis-cli -s "$work/redis.sock" flushall >/dev/null
  redis-cli -s "$work/redis.sock" config resetstat >/dev/null
  local d="$work/run$i"
  mkdir -p "$d"
  : > "$d/access.log"
  sed -e "s#$work/access.log#$d/access.log#" "$work/rules.yaml" > "$d/rules.yaml"
  printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/run.sock\nredis: { url: "unix://%s/redis.sock" }\nfirewall: { backend: log }\n' \
    "$d" "$d" "$work" > "$d/run.yaml"
  "$GEN" --lines "$n" --clients "$CLIENTS" --start-ms "$(($(date +%s%3N) - 5000))" --per-second 1000000 > "$d/live.log"
  # shellcheck disable=SC2086
  RUST_LOG=warn "$BIN" run -c "$d/run.yaml" $extra 2> "$d/run.err" &
  dpid=$!
  for _ in $(seq 200); do [ -S "$d/run.sock" ] && break; sleep 0.05; done
  sleep 1
  local idle
  idle=$(rss_mb "$dpid")
  local t0 t1 c0 r0
  c0=$(cpu_s "$dpid"); r0=$(redis_cpu_s)
  t0=$(date +%s%N)
  cat "$d/live.log" >> "$d/access.log"
  # Done when every line is read and every hit decided: none held
  # (`redis.hold`, up to 1 s after the last line) nor in flight.
  local tr=""
  for _ in $(seq 12000); do
    read -r lines pend < <("$BIN" status -c "$d/run.yaml" --json | python3 -c \
      'import json,sys; s=json.load(sys.stdin); print(s["lines"], s["redis"]["held_hits"] + s["redis"]["inflight_hits"])')
    [ -z "$tr" ] && [ "$lines" -ge "$n" ] && tr=$(date +%s%N)
    [ "$lines" -ge "$n" ] && [ "$pend" -eq 0 ] && break
    sleep 0.02
  done
  t1=$(date +%s%N)
  local c1 r1
  c1=$(cpu_s "$dpid"); r1=$(redis_cpu_s)
  local calls
  calls=$(evalsha_calls)
  "$BIN" status -c "$d/run.yaml" --json > "$d/status.json"
  local after
  after=$(rss_mb "$dpid")
  if [ -n "${RSS_LATER:-}" ]; then
    sleep "$RSS_LATER"
    echo "  RSS ${RSS_LATER} s after the run: $(rss_mb "$dpid") MB (right after: $after MB)" >&2
  fi
  kill "$dpid"; wait "$dpid" 2>/dev/null || true; dpid=""
  python3 - "$d/status.json" "$t0" "$t1" "$idle" "$after" "$c0" "$c1" "$r0" "$r1" "$calls" "$tr" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); secs = (int(sys.argv[3]) - int(sys.argv[2])) / 1e9
read_secs = (int(sys.argv[11]) - int(sys.argv[2])) / 1e9
hits = sum(r["hits"] for r in s["rules"]); rt = s["redis"]["round_trips"]
dcpu = float(sys.argv[7]) - float(sys.argv[6]); rcpu = float(sys.argv[9]) - float(sys.argv[8])
print(s["lines"], f"{secs:.2f}", f"{s['lines'] / secs:.0f}", f"{1000 * rt / max(hits, 1):.2f}", hits, s["bans"],
      sys.argv[4], sys.argv[5], f"{dcpu:.2f}", f"{rcpu:.2f}", f"{1000 * int(sys.argv[10]) / max(hits, 1):.0f}",
      f"{read_secs:.2f}")
PY
}
for i in $(seq "$REPS"); do run_once "$RUN_LINES" "" "p$i" >> "$work/run.res"; done
for i in $(seq "$REPS"); do run_once "$BASE_LINES" "--bench-one-call-per-hit" "b$i" >> "$work/base.res"; done
run_lps=$(cut -d' ' -f3 "$work/run.res" | median)
base_lps=$(cut -d' ' -f3 "$work/base.res" | median)
read -r _ secs _ rt hits bans idle after dcpu rcpu calls rsecs < <(sort -k3 -g "$work/run.res" | sed -n "$(((REPS + 1) / 2))p")
read -r _ bsecs _ brt bhits _ _ _ bdcpu brcpu bcalls _ < <(sort -k3 -g "$work/base.res" | sed -n "$(((REPS + 1) / 2))p")
row "fleetban run + Redis, end to end, $CLIENTS clients" "$run_lps" \
  "$rt round trips, $calls EVALSHA / 1,000 hits ($hits hits, $bans bans, $RUN_LINES lines); wall ${secs} s to every hit decided (${rsecs} s to every line read), CPU daemon ${dcpu} s, redis ${rcpu} s"
row "baseline: one EVALSHA per hit, unpipelined" "$base_lps" \
  "$brt round trips, $bcalls EVALSHA / 1,000 hits ($bhits hits, $BASE_LINES-line prefix); wall ${bsecs} s, CPU daemon ${bdcpu} s, redis ${brcpu} s"
row "  ratio fleetban run / baseline" "$(awk -v a="$run_lps" -v b="$base_lps" 'BEGIN {printf "%.0fx", a / b}')" ""
row "daemon RSS idle (Redis, no bans) / after the run" "${idle} / ${after} MB" ""
echo "runs (lines secs lines/s trips/1000hits hits bans rss_idle rss_after cpu_daemon cpu_redis evalsha/1000hits secs_to_read_all):"
sed 's/^/  pipelined /' "$work/run.res"; sed 's/^/  baseline  /' "$work/base.res"
kill "$rpid"; wait "$rpid" 2>/dev/null || true; rpid=""

# 5: nft (root; network namespaces).
if [ "${SKIP_NFT:-0}" != 1 ] && [ "${ONLY_RUN:-0}" != 1 ]; then
  ONE_BY_ONE=${ONE_BY_ONE:-20} scripts/bench-fleet.sh 20 100000 | tee "$work/fleet.out" | sed 's/^/  /'
  # The medians tests/bench_fleet.rs prints (START_REPS starts, bans one by one).
  start=$(sed -n 's/^ *spawn -> applied (ms) *\([0-9.]*\).*/\1/p' "$work/fleet.out" | awk '{printf "%.0f", $1}')
  tx=$(sed -n 's/^ *nft transaction (s) *\([0-9.]*\).*/\1/p' "$work/fleet.out")
  nft1=$(sed -n 's/.*nft transaction median \([0-9.]*\) ms.*/\1/p' "$work/fleet.out")
  one=$(sed -n 's/.*bans one by one on top of [0-9]*: median \([0-9.]*\) ms.*/\1/p' "$work/fleet.out")
  rss100k=$(sed -n 's/^ *RSS with the bans (MB) *\([0-9.]*\).*/\1/p' "$work/fleet.out")
  row "nft: 100,000 bans at start (spawn -> applied)" "$start ms" "median of the starts; of which the nft transaction $tx s (median)"
  row "nft: one ban at a time on top of 100,000 (median)" "$nft1 ms" "nft transaction; CLI -> ban.lua -> stream -> nft logged ${one} ms (test polls every 50 ms)"
  row "daemon RSS with 100,000 active bans" "$rss100k MB" ""
fi

# 6: Redis memory per tracked address.
if [ "${ONLY_RUN:-0}" != 1 ]; then
  scripts/bench-limiters.sh 10000 | tee "$work/lim.out" | sed 's/^/  /'
  sw=$(grep -m1 '^| sliding_window' "$work/lim.out" || true)
  row "Redis memory per address (bench-limiters, first row)" "" "${sw:-see above}"
fi

echo
printf '| %-58s | %14s | %s\n' "measure" "lines/s" "detail"
printf '|%s|%s|%s\n' "$(printf -- '-%.0s' {1..60})" "$(printf -- '-%.0s' {1..16})" "---"
cat "$work/table"

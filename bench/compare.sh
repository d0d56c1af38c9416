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
#     (bench/fleet.rs through bench/fleet.sh; root, namespaces)
#  6. Redis memory per tracked address (bench/limiters.sh)
# Usage: bench/compare.sh [LINES] [REPS]   (defaults 1000000, 3)
# Env: CLIENTS (50000), F2B_LINES (200000), BASE_LINES (50000), RUN_LINES
# (LINES; more lines make the <= redis.hold wait after the last one weigh less), SKIP_NFT=1,
# ONLY_RUN=1 (part 4 alone, for quick iterations on the Redis path),
# RSS_LATER=SECS (print the daemon's RSS again SECS after each run),
# REDIS_OPTS='hold: 0s' (more keys of the daemons' `redis:` section),
# START_REPS (5: daemon starts on the 100,000 bans).
# BIN_NEW=/path/to/fleetban: this tree's build, when not target/release's.
# Two builds in one run: BIN_OLD=/path/to/old/fleetban (e.g. the previous
# commit built in a `git worktree`). Every row that runs fleetban (1, 4, 5)
# is then measured for this tree's build ("new") and for BIN_OLD ("old"),
# the two alternating within each repetition on the same generated lines,
# and printed for both, followed by the change new / old; 2, 3 and 6 do not
# depend on the build and run once. Part 5 then runs the harness once per
# start: START_REPS rounds of one start per build. OLD_FLAGS: extra `run`
# flags for the "old" build's end-to-end runs (e.g. BIN_OLD=<this build>
# OLD_FLAGS=--bench-one-flight: one round trip in flight against two).
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
# BIN_NEW: this tree's binary built elsewhere (e.g. another CARGO_TARGET_DIR).
[ -n "${BIN_NEW:-}" ] || cargo build --release --bin fleetban >/dev/null
GEN=$(bench/exe.sh loggen)
# The builds measured, by name.
builds=(new)
declare -A bins=([new]=${BIN_NEW:-$PWD/target/release/fleetban})
declare -A flags=([new]="" [old]="${OLD_FLAGS:-}")
if [ -n "${BIN_OLD:-}" ]; then
  builds+=(old)
  bins[old]=$BIN_OLD
fi
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
# A row's label suffix when two builds are measured.
tag() { if [ ${#builds[@]} -gt 1 ]; then echo " [$1]"; fi; }
# The row after a measure's two builds: new / old of the figure, in %.
change() {
  if [ ${#builds[@]} -gt 1 ]; then
    row "  change new / old" "$(awk -v a="$1" -v b="$2" 'BEGIN {printf "%+.1f%%", 100 * (a / b - 1)}')" "$3"
  fi
}

echo "machine: $(nproc) cores, $(awk -F': *' '/model name/ {print $2; exit}' /proc/cpuinfo)," \
  "$(awk '/MemTotal/ {print int($2/1024/1024)" GiB"}' /proc/meminfo), $(uname -r)"
for b in "${builds[@]}"; do echo "build $b: ${bins[$b]} ($("${bins[$b]}" --version))"; done
echo "versions: $(redis-server --version | cut -d' ' -f3), $(nft --version)," \
  "fail2ban $(fail2ban-regex --version 2>&1 | head -1 | awk '{print $NF}')"
"$GEN" --lines "$LINES" --clients "$CLIENTS" > "$work/replay.log"
echo "input: $LINES lines, $CLIENTS clients, $(du -m "$work/replay.log" | cut -f1) MB (bench/loggen.rs)"
sed -e "s#/var/log/nginx/access.log#$work/access.log#" rules/nginx-scraper.yaml > "$work/rules.yaml"
printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/control.sock\n' "$work" "$work" > "$work/test.yaml"
: > "$work/table"

if [ "${ONLY_RUN:-0}" != 1 ]; then
# 1 and 2: the same file, the page cache warm for both.
cat "$work/replay.log" > /dev/null
for _ in $(seq "$REPS"); do
  for b in "${builds[@]}"; do
    /usr/bin/time -f "%e %U %S" -o "$work/t" "${bins[$b]}" test -c "$work/test.yaml" "$work/replay.log" > /dev/null
    cat "$work/t" >> "$work/test.$b.times"
  done
  /usr/bin/time -f "%e %U %S" -o "$work/t" wc -l "$work/replay.log" > /dev/null
  cat "$work/t" >> "$work/wc.times"
done
declare -A test_lps
for b in "${builds[@]}"; do
  tw=$(cut -d' ' -f1 "$work/test.$b.times" | median)
  tc=$(awk '{print $2 + $3}' "$work/test.$b.times" | median)
  test_lps[$b]=$(awk -v n="$LINES" -v w="$tw" 'BEGIN {printf "%.0f", n / w}')
  row "fleetban test (parse+match+decide), nginx-scraper$(tag "$b")" "${test_lps[$b]}" "wall ${tw} s, CPU ${tc} s, $LINES lines"
done
change "${test_lps[new]}" "${test_lps[old]:-}" "lines/s"
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
row "  ratio fleetban test$(tag new) / fail2ban-regex" "$(awk -v a="${test_lps[new]}" -v b="$f2b_lps" 'BEGIN {printf "%.0fx", a / b}')" ""
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
  local bin=$1 n=$2 extra=$3 i=$4
  redis-cli -s "$work/redis.sock" flushall >/dev/null
  redis-cli -s "$work/redis.sock" config resetstat >/dev/null
  local d="$work/run$i"
  mkdir -p "$d"
  : > "$d/access.log"
  sed -e "s#$work/access.log#$d/access.log#" "$work/rules.yaml" > "$d/rules.yaml"
  printf 'rules: [rules.yaml]\nstate_dir: %s/state\ncontrol: %s/run.sock\nredis: { url: "unix://%s/redis.sock"%s }\nfirewall: { backend: log }\n' \
    "$d" "$d" "$work" "${REDIS_OPTS:+, $REDIS_OPTS}" > "$d/run.yaml"
  "$GEN" --lines "$n" --clients "$CLIENTS" --start-ms "$(($(date +%s%3N) - 5000))" --per-second 1000000 > "$d/live.log"
  # shellcheck disable=SC2086
  RUST_LOG=warn "$bin" run -c "$d/run.yaml" $extra 2> "$d/run.err" &
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
    read -r lines pend < <("$bin" status -c "$d/run.yaml" --json | python3 -c \
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
  "$bin" status -c "$d/run.yaml" --json > "$d/status.json"
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
for i in $(seq "$REPS"); do
  for b in "${builds[@]}"; do run_once "${bins[$b]}" "$RUN_LINES" "${flags[$b]}" "p$b$i" >> "$work/run.$b.res"; done
done
for i in $(seq "$REPS"); do
  for b in "${builds[@]}"; do run_once "${bins[$b]}" "$BASE_LINES" "--bench-one-call-per-hit" "b$b$i" >> "$work/base.$b.res"; done
done
declare -A run_lps base_lps idle after
for b in "${builds[@]}"; do
  run_lps[$b]=$(cut -d' ' -f3 "$work/run.$b.res" | median)
  base_lps[$b]=$(cut -d' ' -f3 "$work/base.$b.res" | median)
  read -r _ secs _ rt hits bans "idle[$b]" "after[$b]" dcpu rcpu calls rsecs < <(sort -k3 -g "$work/run.$b.res" | sed -n "$(((REPS + 1) / 2))p")
  row "fleetban run + Redis, end to end, $CLIENTS clients$(tag "$b")" "${run_lps[$b]}" \
    "$rt round trips, $calls EVALSHA / 1,000 hits ($hits hits, $bans bans, $RUN_LINES lines); wall ${secs} s to every hit decided (${rsecs} s to every line read), CPU daemon ${dcpu} s, redis ${rcpu} s"
done
change "${run_lps[new]}" "${run_lps[old]:-}" "lines/s"
for b in "${builds[@]}"; do
  read -r _ bsecs _ brt bhits _ _ _ bdcpu brcpu bcalls _ < <(sort -k3 -g "$work/base.$b.res" | sed -n "$(((REPS + 1) / 2))p")
  row "baseline: one EVALSHA per hit, unpipelined$(tag "$b")" "${base_lps[$b]}" \
    "$brt round trips, $bcalls EVALSHA / 1,000 hits ($bhits hits, $BASE_LINES-line prefix); wall ${bsecs} s, CPU daemon ${bdcpu} s, redis ${brcpu} s"
done
change "${base_lps[new]}" "${base_lps[old]:-}" "lines/s"
for b in "${builds[@]}"; do
  row "  ratio fleetban run / baseline$(tag "$b")" "$(awk -v a="${run_lps[$b]}" -v b="${base_lps[$b]}" 'BEGIN {printf "%.0fx", a / b}')" ""
done
for b in "${builds[@]}"; do
  row "daemon RSS idle (Redis, no bans) / after the run$(tag "$b")" "${idle[$b]} / ${after[$b]} MB" ""
done
change "${after[new]}" "${after[old]:-}" "RSS after the run"
echo "runs (lines secs lines/s trips/1000hits hits bans rss_idle rss_after cpu_daemon cpu_redis evalsha/1000hits secs_to_read_all):"
for b in "${builds[@]}"; do
  sed "s/^/  pipelined$(tag "$b") /" "$work/run.$b.res"; sed "s/^/  baseline$(tag "$b")  /" "$work/base.$b.res"
done
kill "$rpid"; wait "$rpid" 2>/dev/null || true; rpid=""

# 5: nft (root; network namespaces).
# The medians bench/fleet.rs prints (its starts, bans one by one), as
# "start_ms nft_transaction_s one_ban_nft_ms one_ban_cli_ms rss_mb".
nft_figures() {
  local start tx nft1 one rss
  start=$(sed -n 's/^ *spawn -> applied (ms) *\([0-9.]*\).*/\1/p' "$1")
  tx=$(sed -n 's/^ *nft transaction (s) *\([0-9.]*\).*/\1/p' "$1")
  nft1=$(sed -n 's/.*nft transaction median \([0-9.]*\) ms.*/\1/p' "$1")
  one=$(sed -n 's/.*bans one by one on top of [0-9]*: median \([0-9.]*\) ms.*/\1/p' "$1")
  rss=$(sed -n 's/^ *RSS with the bans (MB) *\([0-9.]*\).*/\1/p' "$1")
  echo "$start $tx $nft1 $one $rss"
}
if [ "${SKIP_NFT:-0}" != 1 ] && [ "${ONLY_RUN:-0}" != 1 ]; then
  starts=${START_REPS:-5} rounds=1
  if [ ${#builds[@]} -gt 1 ]; then rounds=$starts starts=1; fi
  for r in $(seq "$rounds"); do
    for b in "${builds[@]}"; do
      measured=""
      [ "$b" = new ] || measured=${bins[$b]}
      [ "$rounds" = 1 ] || echo "  == nft round $r, build $b"
      BIN=$measured START_REPS=$starts ONE_BY_ONE=${ONE_BY_ONE:-20} bench/fleet.sh 20 100000 \
        | tee "$work/fleet.out" | sed 's/^/  /'
      nft_figures "$work/fleet.out" >> "$work/nft.$b.res"
    done
  done
  declare -A start rss100k
  # The median over the rounds of build $1's figure in column $2.
  nft_col() { cut -d' ' -f"$2" "$work/nft.$1.res" | median; }
  for b in "${builds[@]}"; do
    start[$b]=$(nft_col "$b" 1 | awk '{printf "%.0f", $1}')
    rss100k[$b]=$(nft_col "$b" 5)
    row "nft: 100,000 bans at start (spawn -> applied)$(tag "$b")" "${start[$b]} ms" \
      "median of the starts; of which the nft transaction $(nft_col "$b" 2) s (median)"
  done
  change "${start[new]}" "${start[old]:-}" "spawn -> applied"
  for b in "${builds[@]}"; do
    row "nft: one ban at a time on top of 100,000 (median)$(tag "$b")" "$(nft_col "$b" 3) ms" \
      "nft transaction; CLI -> ban.lua -> stream -> nft logged $(nft_col "$b" 4) ms (test polls every 50 ms)"
  done
  for b in "${builds[@]}"; do
    row "daemon RSS with 100,000 active bans$(tag "$b")" "${rss100k[$b]} MB" ""
  done
  change "${rss100k[new]}" "${rss100k[old]:-}" "RSS with the bans"
fi

# 6: Redis memory per tracked address.
if [ "${ONLY_RUN:-0}" != 1 ]; then
  bench/limiters.sh 10000 | tee "$work/lim.out" | sed 's/^/  /'
  sw=$(grep -m1 '^| sliding_window' "$work/lim.out" || true)
  row "Redis memory per address (bench/limiters.sh, first row)" "" "${sw:-see above}"
fi

echo
printf '| %-58s | %14s | %s\n' "measure" "lines/s" "detail"
printf '|%s|%s|%s\n' "$(printf -- '-%.0s' {1..60})" "$(printf -- '-%.0s' {1..16})" "---"
cat "$work/table"

#!/usr/bin/env bash
# nginx through the shipped snippet vs without it, in one run: one nginx
# (one worker) serving the same small static file on two ports, 8081 plain
# and 8082 behind nginx/fleetban-location.conf, loaded by the same wrk in
# alternating runs while `fleetban run` holds BANS active bans (a private
# redis-server; nft in a private network namespace, where everything runs).
# wrk sends `X-Forwarded-For: 198.51.100.7` and nginx's realip trusts
# loopback on both ports, so each check asks about an address that is not
# banned (the common case) and both ports do the same realip work. Access
# logs are off on both: the figure is the check's cost, not the log's.
# Prints each run, then the medians: requests/s (snippet/plain ratio) and
# p99 latency (added by the snippet).
# Usage (root): bench/nginx.sh [REPS] [SECONDS] [BANS]   (defaults 5, 10, 100000)
# Env: BIN=/path/to/fleetban (default: this tree's release build),
#      CONNS=wrk connections (default 16).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5} SECS=${2:-10} BANS=${3:-100000} CONNS=${CONNS:-16}
[ "$(id -u)" = 0 ] || { echo "bench/nginx.sh: needs root (network namespace, nft)" >&2; exit 1; }
scripts/ensure-deps.sh --bench >&2
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin fleetban >&2
  BIN=target/release/fleetban
fi
BIN=$(realpath "$BIN")
repo=$PWD
tmp=$(mktemp -d /tmp/fleetban-bench-nginx.XXXXXX)
ns=fbb-nginx-$$
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
in_ns() { ip netns exec "$ns" "$@"; }

# Redis with BANS bans (3/4 IPv4 addresses, 1/4 IPv6 /64s), one hour left.
redis-server --port 0 --unixsocket "$tmp/redis.sock" --save "" --appendonly no \
  --dir "$tmp" --logfile "$tmp/redis.log" --daemonize no >/dev/null 2>&1 &
pids+=($!)
rcli() { redis-cli -s "$tmp/redis.sock" "$@"; }
for _ in $(seq 100); do rcli PING >/dev/null 2>&1 && break; sleep 0.05; done
until=$(( $(date +%s%3N) + 3600000 ))
rcli EVAL "local n = tonumber(ARGV[1]) local u = ARGV[2]
  for i = 0, n - 1 do
    local m
    if i % 4 == 3 then m = string.format('2001:db8:%x:%x::/64', math.floor(i / 65536), i % 65536)
    else m = string.format('%d.%d.%d.%d', 100 + math.floor(i / 16777216) % 50, math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256) end
    redis.call('ZADD', KEYS[1], u, m) end return n" 1 '{fleetban}:bans' "$BANS" "$until" >/dev/null
[ "$(rcli ZCARD '{fleetban}:bans')" = "$BANS" ]

# The daemon: the endpoint on a unix socket; a rule on a log nobody writes.
mkdir -p "$tmp/www" "$tmp/tmp" "$tmp/state"
: > "$tmp/idle.log"
cat > "$tmp/rules.yaml" <<EOF
rules:
  - name: idle
    logs: [$tmp/idle.log]
    limit: { hits: 100, window: 60s }
EOF
cat > "$tmp/fleetban.yaml" <<EOF
host_id: bench
state_dir: $tmp/state
control: $tmp/control.sock
http: { listen: '$tmp/http.sock' }
redis: { url: 'unix://$tmp/redis.sock' }
rules: [$tmp/rules.yaml]
EOF
# Started with `ip netns exec` itself (not through a function, which would
# fork a subshell): $! is the daemon's pid.
ip netns exec "$ns" "$BIN" run -c "$tmp/fleetban.yaml" 2>"$tmp/fleetban.log" &
pids+=($!)

# nginx: the shipped snippet, its socket path substituted.
head -c 600 /dev/zero | tr '\0' 'x' > "$tmp/www/page.html"
sed "s#unix:/run/fleetban/http.sock#unix:$tmp/http.sock#" nginx/fleetban.conf > "$tmp/fleetban.conf"
cat > "$tmp/nginx.conf" <<EOF
worker_processes 1;
daemon off;
user root root;
pid $tmp/nginx.pid;
error_log $tmp/nginx-error.log notice;
events { worker_connections 1024; }
http {
    client_body_temp_path $tmp/tmp/body;
    proxy_temp_path $tmp/tmp/proxy;
    access_log off;
    include $tmp/fleetban.conf;
    set_real_ip_from 127.0.0.1;
    real_ip_header X-Forwarded-For;
    real_ip_recursive on;
    server {
        listen 127.0.0.1:8081;
        root $tmp/www;
    }
    server {
        listen 127.0.0.1:8082;
        root $tmp/www;
        include $repo/nginx/fleetban-location.conf;
    }
}
EOF
ip netns exec "$ns" nginx -p "$tmp" -c "$tmp/nginx.conf" -e "$tmp/nginx-error.log" &
pids+=($!)

# Ready when a banned address is refused through the snippet and served
# without it (the daemon has loaded the list).
code() { in_ns curl -s -o /dev/null -w '%{http_code}' --max-time 1 -H "X-Forwarded-For: $1" "http://127.0.0.1:$2/page.html" || true; }
ready=0
for _ in $(seq 300); do
  if [ "$(code 100.0.0.5 8082)" = 403 ] && [ "$(code 100.0.0.5 8081)" = 200 ]; then ready=1; break; fi
  sleep 0.1
done
if [ "$ready" != 1 ]; then
  echo "bench/nginx.sh: the snippet never refused a banned address (8082: $(code 100.0.0.5 8082)," \
    "8081: $(code 100.0.0.5 8081)); fleetban's log, nginx's error log:" >&2
  tail -20 "$tmp/fleetban.log" "$tmp/nginx-error.log" >&2
  exit 1
fi
[ "$(code 198.51.100.7 8082)" = 200 ]

# From here on, a failed check in nginx's error log happened during a run.
: > "$tmp/nginx-error.log"
nginx_master=${pids[2]}
daemon=${pids[1]}
worker=$(pgrep -P "$nginx_master")
# CPU ticks (user + system) a process has used.
ticks() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat"; }

# One wrk run on PORT: "requests/s p99_ms nginx_us_per_request daemon_us_per_request".
run() {
  local n0 d0 out
  n0=$(ticks "$worker") d0=$(ticks "$daemon")
  out=$(in_ns wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -H 'X-Forwarded-For: 198.51.100.7' \
    "http://127.0.0.1:$1/page.html")
  awk -v n="$(( $(ticks "$worker") - n0 ))" -v d="$(( $(ticks "$daemon") - d0 ))" -v hz="$(getconf CLK_TCK)" '
      / requests in / { reqs = $1 }
      /^Requests\/sec:/ { rps = $2 }
      /^ +99%/ { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
                 p99 = (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : v }
      /Non-2xx/ { bad = 1 }
      END { if (bad || rps == "" || reqs == 0) exit 1;
            printf "%s %.3f %.1f %.1f\n", rps, p99, n * 1e6 / hz / reqs, d * 1e6 / hz / reqs }' <<< "$out"
}
median() { sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
col() { cut -d' ' -f"$2" "$tmp/$1" | median; }

echo "machine: $(nproc) cores, $(uname -r), $(nginx -v 2>&1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "fleetban: $BIN ($("$BIN" --version)), $BANS active bans; wrk -t1 -c$CONNS -d${SECS}s, $REPS alternating runs"
echo "run  plain: req/s p99_ms nginx_us/req daemon_us/req  snippet: req/s p99_ms nginx_us/req daemon_us/req"
: > "$tmp/plain" && : > "$tmp/snippet"
for i in $(seq "$REPS"); do
  # Alternate which goes first, so a drift in the machine's load hits both.
  if [ $((i % 2)) = 1 ]; then p=$(run 8081); s=$(run 8082); else s=$(run 8082); p=$(run 8081); fi
  echo "$p" >> "$tmp/plain"
  echo "$s" >> "$tmp/snippet"
  echo "$i  plain: $p  snippet: $s"
done
awk -v pr="$(col plain 1)" -v pp="$(col plain 2)" -v pn="$(col plain 3)" \
    -v sr="$(col snippet 1)" -v sp="$(col snippet 2)" -v sn="$(col snippet 3)" -v sd="$(col snippet 4)" 'BEGIN {
  printf "median: plain %.0f req/s, p99 %.3f ms, nginx %.1f us CPU/request\n", pr, pp, pn
  printf "median: snippet %.0f req/s, p99 %.3f ms, nginx %.1f us CPU/request, daemon %.1f us CPU/request\n", sr, sp, sn, sd
  printf "ratio snippet/plain %.2f (target >= 0.8); p99 added %.3f ms\n", sr / pr, sp - pp }'
failed=$(grep -c "fleetban-check" "$tmp/nginx-error.log" || true)
echo "failed checks during the runs (each let a request through): $failed"

#!/usr/bin/env bash
# The kernel's walk of a timeout set for its expired elements, seen from one
# `nft add element` every 0.5 s (root: a network namespace of its own).
# A set of N elements with per-element timeouts is loaded, then for SECS
# seconds one element is added at a time and each `nft` run is timed (the
# program's own start included, ~5 ms). GC is the set's `gc-interval`:
# `default` (the kernel walks the set every second) or a value such as 60s
# (fleetban's, enforce::script::GC_INTERVAL_S). Prints p50, p99, max and
# how many took over 50 ms.
# Usage: bench/nft-gc.sh [N] [GC] [SECS]   (defaults: 1000000 default 120)
set -euo pipefail
n=${1:-1000000}
gc=${2:-default}
secs=${3:-120}
ns=fbgc$$
dir=$(mktemp -d)
cleanup() { ip netns del "$ns" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
gc_line=""
[ "$gc" != default ] && gc_line="gc-interval $gc;"
{
  echo "table inet t {"
  echo " set v4 { type ipv4_addr; flags timeout; $gc_line }"
  echo " chain input { type filter hook input priority -10; policy accept; ip saddr @v4 drop; }"
  echo "}"
  echo "add element inet t v4 {"
  awk -v n="$n" 'BEGIN { for (i = 0; i < n; i++) printf "%d.%d.%d.%d timeout 3600s,\n", 100 + int(i / 16777216) % 50, int(i / 65536) % 256, int(i / 256) % 256, i % 256 }'
  echo "}"
} > "$dir/ruleset.nft"
ip netns add "$ns"
t0=$(date +%s%N)
ip netns exec "$ns" nft -f "$dir/ruleset.nft"
echo "machine: $(nproc) cores, $(uname -r), $(nft --version)"
echo "loaded $n elements (gc-interval: $gc) in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
end=$(( $(date +%s) + secs ))
i=0
while [ "$(date +%s)" -lt "$end" ] && [ "$i" -lt 10000 ]; do
  a=$(date +%s%N)
  ip netns exec "$ns" nft add element inet t v4 "{ 198.18.$((i / 250)).$((i % 250 + 1)) timeout 3600s }"
  echo $(( ($(date +%s%N) - a) / 1000 )) >> "$dir/us"
  i=$((i + 1))
  sleep 0.5
done
sort -n "$dir/us" | awk '{ v[NR] = $1; if ($1 > 50000) slow++ }
  END { printf "one add on top, n=%d: p50 %.2f ms, p99 %.2f ms, max %.2f ms; over 50 ms: %d\n",
        NR, v[int((NR + 1) * 0.5)] / 1000, v[int(NR * 0.99 + 0.5)] / 1000, v[NR] / 1000, slow + 0 }'

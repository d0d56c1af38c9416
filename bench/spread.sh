#!/usr/bin/env bash
# Spread attackers over three hosts (issue 13), one run (root: namespaces,
# nft, nginx): ATTACKERS clients each send LIMIT + 1 requests round-robin
# over three hosts with real nginx (limit LIMIT / 60 s for the fleet); per
# attacker, its last request -> its element in all three hosts' nft sets
# (nft monitor in each namespace). p50/p99/max per repetition, medians of
# REPS, pooled percentiles, one table.
# The harness is bench/spread.rs (a [[bench]] target; never part of the suite).
# Usage: bench/spread.sh
# Env: ATTACKERS (20), LIMIT (20), REPS (5);
#  HOLD=0s writes `hold: 0s` in the daemons' `redis:` section (unset: the
#  defaults), to compare the hold with none;
#  BIN_NEW=/path/to/fleetban: the build measured (default: this tree's
#  release build); BIN_OLD=/path/to/old/fleetban: a second build, the two
#  alternating in every repetition.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -n "${BIN_NEW:-}" ] || cargo build --release --bin fleetban >/dev/null
export BIN_NEW=${BIN_NEW:-$PWD/target/release/fleetban}
harness=$(bench/exe.sh spread)
echo "machine: $(nproc) cores, $(uname -r), $(nft --version), $(nginx -v 2>&1), $(redis-server --version | cut -d' ' -f3)"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for b in "$BIN_NEW" ${BIN_OLD:+"$BIN_OLD"}; do echo "build: $b ($("$b" --version))"; done
"$harness" propagation

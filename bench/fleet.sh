#!/usr/bin/env bash
# Whole-process fleet benchmarks (root: network namespaces and nft), one run:
#  1. propagation latency: a line pair appended on host A -> the ban's element
#     in host B's nft set (nft monitor), p50/p90/p99 over BANS bans, split at
#     the ban event's stream id (Redis clock of ban.lua);
#  2. start with START_BANS active bans in the list (START_REPS starts, default
#     5, medians printed): spawn -> all in the
#     kernel's sets, and what one more ban costs on top of them.
# The harness is bench/fleet.rs (a [[bench]] target; never part of the suite).
# Usage: bench/fleet.sh [BANS] [START_BANS]   (defaults 200, 100000)
# Env: BIN=/path/to/fleetban measures that build instead of this tree's.
#      NOTIFY=silent gives both hosts a notify: target that never answers.
set -euo pipefail
cd "$(dirname "$0")/.."
export BANS=${1:-200} START_BANS=${2:-100000}
harness=$(bench/exe.sh fleet)
benches=(propagation_latency start_with_100k_bans)
echo "machine: $(nproc) cores, $(uname -r), $(nft --version)"
if [ -z "${BIN:-}" ]; then
  "$harness" "${benches[@]}"
else
  # The harness spawns the fleetban that cargo built beside it (its path is
  # compiled in: tests/common's fleetban_bin). In a private mount namespace
  # that path is BIN; the namespaces and daemons it starts live inside it.
  echo "build measured: $BIN ($("$BIN" --version))"
  # shellcheck disable=SC2016 # $1.. are the inner shell's
  unshare --mount --propagation private sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
    sh "$BIN" "${CARGO_TARGET_DIR:-$PWD/target}/release/fleetban" "$harness" "${benches[@]}"
fi

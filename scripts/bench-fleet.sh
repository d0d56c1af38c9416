#!/usr/bin/env bash
# Whole-process fleet benchmarks (root: network namespaces and nft), one run:
#  1. propagation latency: a line pair appended on host A -> the ban's element
#     in host B's nft set (nft monitor), p50/p90/p99 over BANS bans, split at
#     the ban event's stream id (Redis clock of ban.lua);
#  2. start with START_BANS active bans in the list (START_REPS starts, default
#     5, medians printed): spawn -> all in the
#     kernel's sets, and what one more ban costs on top of them.
# The harness is tests/bench_fleet.rs (#[ignore], so never part of the suite).
# Usage: scripts/bench-fleet.sh [BANS] [START_BANS]   (defaults 200, 100000)
set -euo pipefail
cd "$(dirname "$0")/.."
export BANS=${1:-200} START_BANS=${2:-100000}
echo "machine: $(nproc) cores, $(uname -r), $(nft --version)"
cargo test --release --test bench_fleet -- --ignored --nocapture --test-threads 1 2>&1 \
  | grep -v '^running\|^test result\|^$'

#!/usr/bin/env bash
# A long ban list, whole-process (issue 27; root: namespaces, nft): Redis
# memory per ban, daemon RSS idle and with the bans, start (spawn -> every
# element in nft and /check answering from them) beside nft's own
# transaction of the same ruleset, one ban on top (address and /24: nft
# transaction, and decided on host A -> in host B's set).
# The harness is bench/scale.rs (a [[bench]] target; never part of the suite).
# Usage: bench/scale.sh [BANS]   (default 100000)
# Env: SCALE_SHAPE=addr (3/4 IPv4 addresses, 1/4 IPv6 /64s) or net (IPv4
# /16-/31 and IPv6 /32-/63 networks, none inside another: 71% IPv4 at
# 100,000, 2% at 1,000,000), ONE_BY_ONE (10 bans of each kind),
# BIN=/path/to/fleetban measures that build instead of this tree's.
# SCALE_START_LOG=1: each host's log lines of its start, ms after the spawn.
# SCALE_STEADY=SECS with SCALE_RECONCILE=6s (the hosts' reconcile_every):
# a ban every 0.5 s for SECS s, timed to B's set across B's reconciles.
set -euo pipefail
cd "$(dirname "$0")/.."
export SCALE_BANS=${1:-100000}
harness=$(bench/exe.sh scale)
echo "machine: $(nproc) cores, $(uname -r), $(nft --version), redis $(redis-server --version | cut -d' ' -f3)"
if [ -z "${BIN:-}" ]; then
  cargo build --release --bin fleetban >/dev/null
  "$harness" scale
else
  # As bench/fleet.sh: the compiled-in fleetban path is BIN in a private
  # mount namespace.
  echo "build measured: $BIN ($("$BIN" --version))"
  # shellcheck disable=SC2016 # $1.. are the inner shell's
  unshare --mount --propagation private sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' \
    sh "$BIN" "$PWD/target/release/fleetban" "$harness" scale
fi

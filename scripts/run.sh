#!/usr/bin/env bash
# The main job on a fresh machine: installs nft if missing, builds fleetban,
# checks the configuration and runs the daemon in the foreground.
# Config: $1, else /etc/fleetban/fleetban.yaml if present, else the shipped
# single-host example (embedded store, rules/*.yaml, /var/log/nginx/access.log).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nft >/dev/null 2>&1 && [ ! -x /usr/sbin/nft ]; then
  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nftables
fi
cargo build --release
cfg=${1:-}
if [ -z "$cfg" ]; then
  if [ -f /etc/fleetban/fleetban.yaml ]; then
    cfg=/etc/fleetban/fleetban.yaml
  else
    cfg=$(mktemp -d)/fleetban.yaml
    sed -e "s#/etc/fleetban/rules.d/\*.yaml#$PWD/rules/*.yaml#" config/fleetban.yaml > "$cfg"
    echo "using the shipped example configuration: $cfg"
  fi
fi
./target/release/fleetban check -c "$cfg"
exec ./target/release/fleetban run -c "$cfg"

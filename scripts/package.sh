#!/usr/bin/env bash
# Builds the Debian package: the binary, then the man page and shell
# completions generated from the CLI definition (`fleetban manpage`,
# `fleetban completions SHELL`), then `cargo deb --no-build` (stripped).
# Usage: scripts/package.sh [PROFILE] [--no-build]
#   PROFILE: release (default) or dev (what tests/package.rs uses: no extra
#   compile; cargo-deb warns that dev is not meant for releases).
#   --no-build: the binary of that profile is already built.
# Prints the path of the .deb on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-release}
BUILD=1; [ "${2:-}" = --no-build ] && BUILD=0
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked >&2
[ "$BUILD" = 1 ] && cargo build --profile "$PROFILE" --bin fleetban >&2
dir=$PROFILE; [ "$PROFILE" = dev ] && dir=debug
BIN=target/$dir/fleetban
mkdir -p target/assets target/debian
"$BIN" manpage | gzip -9n > target/assets/fleetban.1.gz
"$BIN" completions bash > target/assets/fleetban.bash
"$BIN" completions zsh > target/assets/_fleetban
"$BIN" completions fish > target/assets/fleetban.fish
FAST=(); [ "$PROFILE" = dev ] && FAST=(--fast)
out=target/debian/fleetban-$PROFILE.deb
cargo deb --no-build --profile "$PROFILE" --strip "${FAST[@]}" -o "$out" >&2
echo "$out"

#!/usr/bin/env bash
# Installs the system tools the integration tests drive (real redis-server,
# nft, nginx, ip, curl, logrotate, systemd-analyze, man; systemd-nspawn,
# debootstrap and Debian's archive keyring for the machine that
# tests/systemd.rs boots) when any is missing. Never starts a service:
# tests spawn their own instances.
# Usage: scripts/ensure-deps.sh [--bench]   (--bench: also the load generator
# the bench/ drivers use, wrk)
set -euo pipefail

# binary -> Debian package
declare -A PKG=(
  [redis-server]=redis-server
  [redis-cli]=redis-tools
  [redis-sentinel]=redis-sentinel
  [openssl]=openssl
  [nft]=nftables
  [nginx]=nginx
  [ip]=iproute2
  [logrotate]=logrotate
  [curl]=curl
  [systemd-analyze]=systemd
  [man]=man-db
  [unshare]=util-linux
  [nsenter]=util-linux
  [systemd-nspawn]=systemd-container
  [debootstrap]=debootstrap
  [dpkg-deb]=dpkg
)
if [ "${1:-}" = --bench ]; then
  PKG[wrk]=wrk
fi

have() {
  command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]
}

# cargo-deb builds the Debian package that tests/package.rs installs.
if ! command -v cargo-deb >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo-deb" ]; then
  echo "ensure-deps: installing cargo-deb from crates.io"
  cargo install cargo-deb --locked
fi

# debootstrap checks the tree's packages against this keyring.
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

missing=()
for bin in "${!PKG[@]}"; do
  have "$bin" || missing+=("${PKG[$bin]}")
done
[ -f "$KEYRING" ] || missing+=(debian-archive-keyring)
if [ ${#missing[@]} -eq 0 ]; then
  echo "ensure-deps: all test dependencies present"
  exit 0
fi
echo "ensure-deps: installing ${missing[*]}"

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "ensure-deps: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

# Debian starts redis and nginx from their postinst; a policy-rc.d that denies
# every action stops that. Only remove it if we put it there.
POLICY=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$POLICY" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${SUDO[@]}" tee "$POLICY" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY"
  created_policy=1
fi
cleanup() { if [ "$created_policy" = 1 ]; then "${SUDO[@]}" rm -f "$POLICY"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"

still=()
for bin in "${!PKG[@]}"; do
  have "$bin" || still+=("$bin")
done
[ -f "$KEYRING" ] || still+=("$KEYRING")
if [ ${#still[@]} -ne 0 ]; then
  echo "ensure-deps: still missing after install: ${still[*]}" >&2
  exit 1
fi
echo "ensure-deps: done"

#!/usr/bin/env bash
# Test helper: runs CMD in a private mount namespace where
# /run/systemd/journal is DIR, so a test that binds DIR/socket receives
# what CMD sends to "the journal" (native protocol datagrams). The machine's
# own /run is untouched (a tmpfs hides it inside the namespace only).
# Usage (root): scripts/in-journal-ns.sh DIR -- CMD [ARGS...]
set -euo pipefail
dir=$(realpath "$1"); shift
[ "${1:-}" = -- ] && shift
if [ "${FLEETBAN_JOURNAL_NS:-}" != 1 ]; then
  exec env FLEETBAN_JOURNAL_NS=1 unshare --mount --propagation private -- "$0" "$dir" -- "$@"
fi
mount -t tmpfs tmpfs /run
mkdir -p /run/systemd/journal
mount --bind "$dir" /run/systemd/journal
exec "$@"

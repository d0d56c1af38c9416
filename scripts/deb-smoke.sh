#!/usr/bin/env bash
# `dpkg -i` of a fleetban .deb followed by `fleetban check`, on a throwaway
# copy of this machine: a private mount namespace, an overlay of / whose
# writes go to a tmpfs, chroot into it. The machine itself is not changed
# (its dpkg database, /usr/bin, /etc stay as they were) and nothing is left
# behind: the namespace and its tmpfs vanish when this script ends.
# Usage (root): scripts/deb-smoke.sh PATH.deb
set -euo pipefail
deb=$(realpath "$1")
if [ "${FLEETBAN_DEB_SMOKE_NS:-}" != 1 ]; then
  exec env FLEETBAN_DEB_SMOKE_NS=1 unshare --mount --propagation private -- "$0" "$deb"
fi
tmp=$(mktemp -d /tmp/fleetban-deb-smoke.XXXXXX)
trap 'umount -R -l "$tmp" 2>/dev/null || true; rmdir "$tmp" 2>/dev/null || true' EXIT
mount -t tmpfs tmpfs "$tmp"
mkdir "$tmp/upper" "$tmp/work" "$tmp/root"
mount -t overlay overlay -o "lowerdir=/,upperdir=$tmp/upper,workdir=$tmp/work" "$tmp/root"
for d in proc sys dev; do mount --bind "/$d" "$tmp/root/$d"; done
mount -t tmpfs tmpfs "$tmp/root/run"
cp "$deb" "$tmp/root/tmp/fleetban.deb"
in_root() { chroot "$tmp/root" "$@"; }

# A fresh machine as far as fleetban goes.
in_root dpkg --purge fleetban >/dev/null 2>&1 || true
in_root rm -rf /etc/fleetban /var/lib/fleetban /usr/bin/fleetban

echo "== dpkg -i"
in_root dpkg -i /tmp/fleetban.deb
echo "== fleetban check"
in_root fleetban check
echo "== installed files"
in_root test -d /var/lib/fleetban
in_root test -f /lib/systemd/system/fleetban.service
in_root test -f /usr/share/man/man1/fleetban.1.gz
echo "== the man page renders without a warning"
warnings=$(in_root env MANWIDTH=80 man --warnings=all -l /usr/share/man/man1/fleetban.1.gz 2>&1 >/dev/null)
[ -z "$warnings" ] || { echo "$warnings" >&2; exit 1; }
in_root test -f /usr/share/bash-completion/completions/fleetban
in_root test -f /usr/share/fleetban/rules/nginx-limit-req.yaml
echo "== nginx -t with the shipped snippet in Debian's nginx.conf"
# As README.md says to include it: fleetban.conf in the http block (through
# conf.d), fleetban-location.conf in a server block.
in_root test -f /etc/fleetban/nginx/fleetban.conf
in_root test -f /etc/fleetban/nginx/fleetban-location.conf
echo 'include /etc/fleetban/nginx/fleetban.conf;' > "$tmp/root/etc/nginx/conf.d/fleetban.conf"
cat > "$tmp/root/etc/nginx/sites-enabled/fleetban-smoke" <<'EOF'
server {
    listen 127.0.0.1:8099;
    server_name fleetban-smoke;
    include /etc/fleetban/nginx/fleetban-location.conf;
    location / { root /var/www/html; }
}
EOF
in_root nginx -t
echo "== systemd-analyze verify (installed unit, binary and man page)"
in_root systemd-analyze verify /lib/systemd/system/fleetban.service
echo "== dpkg -i again (upgrade in place)"
in_root dpkg -i /tmp/fleetban.deb
in_root fleetban check
echo "== purge"
in_root dpkg --purge fleetban
in_root test ! -e /var/lib/fleetban
in_root test ! -e /usr/bin/fleetban
echo "deb-smoke: ok"

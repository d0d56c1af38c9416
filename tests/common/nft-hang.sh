#!/bin/sh
# A hung nft, for tests/systemd.rs: mounted at /usr/local/sbin/nft in a test
# machine, ahead of /usr/sbin/nft on systemd's PATH. It runs the real nft,
# except for children of the pid written in /etc/fbtest-nft-hang (the
# daemon the test wants stuck): those sleep instead, so the daemon restarted
# with a new pid is not.
hang=/etc/fbtest-nft-hang
if [ -r "$hang" ] && [ "$PPID" = "$(cat "$hang")" ]; then
  exec sleep 600
fi
exec /usr/sbin/nft "$@"

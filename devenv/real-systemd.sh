#!/bin/sh
# A real systemd for trying the shipped unit by hand where PID 1 is not
# systemd (a container, this project's machines): systemd runs as PID 1 of
# its own PID and mount namespaces, chrooted into an overlay of / whose
# writes land in a tmpfs, so nothing it does (systemd-tmpfiles empties
# /tmp at boot) reaches the machine's files. Services the image enables
# (databases, brokers, timers, getty, networking) are masked in the
# overlay; the network namespace is the machine's, so an embedded
# Placement on loopback is reachable from inside.
#
# As root:  nohup unshare --mount --pid --fork --propagation private \
#             devenv/real-systemd.sh > /tmp/real-systemd.log 2>&1 &
# Then:     S="nsenter -t $(pgrep -xo systemd) -m -p -r -w"
#           $S systemctl is-system-running
#           $S sh -c 'cd /root && git clone -q /work/main na && cd na && make install-service'
# Files from outside: pass them on stdin ($S sh -c 'cat > /root/f' < f);
# a file of / changed after the overlay was mounted may not show inside.
# Stop: kill -9 the namespace's systemd (its PID 1); the overlay goes with it.
set -e
# PID 1 of a new PID namespace, or nothing is done: every mount below would
# otherwise land in the machine's own namespace.
[ "$$" = 1 ] || {
  echo "run me under: unshare --mount --pid --fork --propagation private $0" >&2; exit 2; }
O=${OVERLAY_DIR:-/mnt/real-systemd}
CHECKOUT=${CHECKOUT:-$(cd "$(dirname "$0")/.." && pwd)}
mkdir -p "$O"
mountpoint -q "$O" || mount -t tmpfs -o size=6G tmpfs "$O"
mkdir -p "$O/u" "$O/w" "$O/m"
mount -t overlay overlay -o "lowerdir=/,upperdir=$O/u,workdir=$O/w" "$O/m"
M=$O/m
mount -t proc proc "$M/proc"
mount --rbind /dev "$M/dev"
mount --rbind /sys "$M/sys"
mkdir -p "$M$CHECKOUT"
mount --bind "$CHECKOUT" "$M$CHECKOUT"
mount -o remount,bind,ro "$M$CHECKOUT"
mount -t tmpfs tmpfs "$M/tmp"
mount -t tmpfs tmpfs "$M/run"
E=$M/etc/systemd/system
rm -f "$E"/multi-user.target.wants/* "$E"/timers.target.wants/* \
  "$E"/sysinit.target.wants/* "$E"/getty.target.wants/* "$E"/sockets.target.wants/*
for u in getty@tty1.service console-getty.service networking.service \
  systemd-timesyncd.service systemd-networkd.service systemd-resolved.service \
  ssh.service cron.service systemd-udevd.service systemd-udev-trigger.service; do
  ln -sf /dev/null "$E/$u"
done
exec chroot "$M" /usr/bin/env container=other /usr/bin/systemd --system --unit=multi-user.target

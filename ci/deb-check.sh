#!/usr/bin/env bash
# The .deb on a clean Debian 12: builds the package (cpack), makes a minimal bookworm chroot with
# debootstrap, installs the package there with apt (its dependencies come from Debian's registry),
# and runs `tinygpt verify` from the installed files. Needs root and Debian's package registry; takes
# a few minutes (most of it apt installing LibTorch's run-time libraries in the chroot).
# Usage: bash ci/deb-check.sh [CHROOT_DIR]   (default /var/tmp/tinygpt-deb-check; reused when present)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-/var/tmp/tinygpt-deb-check}
command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap
cmake --build build --target package
DEB=$(ls -t build/package/tinygpt-verify_*.deb | head -1)
echo "deb-check: $DEB"
dpkg-deb --info "$DEB" | sed -n '/Depends/p;/Recommends/p'
if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase bookworm "$ROOT" http://deb.debian.org/debian
fi
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
cp "$DEB" "$ROOT/tmp/tinygpt.deb"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" 2>/dev/null || true' EXIT
chroot "$ROOT" /bin/sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -q && apt-get install -y -q --no-install-recommends /tmp/tinygpt.deb'
chroot "$ROOT" /bin/sh -c 'cd /tmp && tinygpt verify --json /tmp/verify.json'
echo "deb-check: tinygpt verify passed from the installed package in a clean bookworm chroot"

#!/bin/sh
# Runs PROGRAM inside the forky chroot (ci/forky.sh makes it) in a private mount namespace: /proc, the
# temporary folder (where conform writes the model) and this repository (at /suite) are mounted in,
# and nothing stays mounted after the program exits. Needs root (unshare, chroot).
#   engines/forky/run.sh PROGRAM [ARGS...]     PROGRAM as the chroot sees it, e.g. /usr/bin/python3
#                                               or /suite/.engines/llama.cpp-0.7/adapter
# TINYGPT_FORKY_ROOT overrides the chroot's path.
here=$(cd "$(dirname "$0")/../.." && pwd)
root=${TINYGPT_FORKY_ROOT:-$here/.engines/forky-root}
tmp=${TMPDIR:-/tmp}
[ -f "$root/versions.txt" ] || { echo "forky: no chroot at $root (run ci/forky.sh)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: engines/forky/run.sh PROGRAM [ARGS...]" >&2; exit 2; }
mkdir -p "$root/suite" "$root$tmp"
exec unshare -m sh -c 'mount -t proc proc "$1/proc" && mount --bind "$2" "$1$2" && mount --bind "$3" "$1/suite" &&
  shift 3 && exec chroot "$0" "$@"' "$root" "$root" "$tmp" "$here" "$@"

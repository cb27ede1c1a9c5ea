#!/bin/sh
# The transformers adapter inside the forky chroot (ci/forky.sh makes it): a private mount namespace
# with /proc, the temporary folder (where conform writes the model) and this repository (/suite)
# mounted in, so nothing is left mounted after the engine exits. Needs root (unshare, chroot).
#   engines/transformers/run.sh --cache dynamic|sliding|static
# TINYGPT_FORKY_ROOT overrides the chroot's path.
here=$(cd "$(dirname "$0")/../.." && pwd)
root=${TINYGPT_FORKY_ROOT:-$here/.engines/forky-root}
tmp=${TMPDIR:-/tmp}
[ -f "$root/versions.txt" ] || { echo "transformers: no forky chroot at $root (run ci/forky.sh)" >&2; exit 1; }
mkdir -p "$root/suite" "$root$tmp"
exec unshare -m sh -c 'mount -t proc proc "$1/proc" && mount --bind "$2" "$1$2" && mount --bind "$3" "$1/suite" &&
  shift 3 && exec chroot "$0" /usr/bin/python3 /suite/engines/transformers/adapter.py "$@"' "$root" "$root" "$tmp" "$here" "$@"

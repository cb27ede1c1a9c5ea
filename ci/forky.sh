#!/usr/bin/env bash
# Debian forky (the next release, same registry) as a pinned, cached chroot for the engines bookworm
# lacks: Hugging Face transformers with its PyTorch (python3-transformers, python3-torch) and llama.cpp
# 0.7.0 (libllama-dev, llama.cpp-tools: the library and llama-server; python3-gguf). Made once
# into .engines/forky-root (ignored by git) and reused while it is there; the exact versions it got are
# recorded in .engines/forky-root/versions.txt (forky moves: a test says which it saw).
# Exits 0 when the chroot is ready; non-zero with one line saying why not (no debootstrap, the
# registry unreachable, a package missing), and the tests that need it skip, saying so.
# Cost here (2026-12-02, 2-core machine): 2.2 GB on disk, 9 minutes the first time beside a test run
# (1.4 GB of packages downloaded); seconds when it is there.
#   [ROOT=.engines/forky-root] [MIRROR=http://deb.debian.org/debian] bash ci/forky.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-$PWD/.engines/forky-root}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# transformers with its PyTorch; llama.cpp 0.7.0's library, headers and tools (llama-server), and its
# gguf writer (the llama-server adapter adds the vocabulary the server needs to print text).
PACKAGES="python3-transformers python3-torch libllama-dev llama.cpp-tools python3-gguf"
RECORD="python3-transformers python3-torch python3 libllama0 libggml0 llama.cpp-tools python3-gguf"
say() { echo "forky: $*" >&2; }
if [ -f "$ROOT/versions.txt" ] && [ "$(head -1 "$ROOT/versions.txt")" = "packages: $PACKAGES" ]; then
  say "ready: $ROOT ($(sed -n 2,3p "$ROOT/versions.txt" | tr '\n' ' '))"
  exit 0
fi
# The chroot takes about 2.2 GB: refuse up front where the disk cannot hold it (with room to spare).
mkdir -p "$(dirname "$ROOT")"
free_kb=$(df -Pk "$(dirname "$ROOT")" 2>/dev/null | awk 'NR == 2 {print $4}')
if [ -n "$free_kb" ] && [ "$free_kb" -lt $((6 * 1024 * 1024)) ]; then
  say "only $((free_kb / 1024)) MB free under $(dirname "$ROOT"): the chroot needs about 2.2 GB (6 GB free asked)"
  exit 1
fi
command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap >/dev/null 2>&1 ||
  { say "debootstrap is not installed and could not be"; exit 1; }
# bookworm's debootstrap has no forky script: forky is bootstrapped with sid's (Debian's own advice).
if [ ! -f "$ROOT/etc/debian_version" ]; then
  say "debootstrap forky into $ROOT"
  rm -rf "$ROOT"
  debootstrap --variant=minbase forky "$ROOT" "$MIRROR" /usr/share/debootstrap/scripts/sid >/dev/null 2>&1 ||
    { say "debootstrap forky from $MIRROR failed"; rm -rf "$ROOT"; exit 1; }
fi
echo "deb $MIRROR forky main" > "$ROOT/etc/apt/sources.list"
say "installing $PACKAGES"
# forky's Release file has been seen past its Valid-Until date: accepted, the signature still checked.
unshare -m bash -c "mount -t proc proc '$ROOT/proc' && chroot '$ROOT' /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -c \
  'apt-get -o Acquire::Check-Valid-Until=false update -q >/dev/null &&
   apt-get -o Acquire::Check-Valid-Until=false install -y -q --no-install-recommends $PACKAGES >/dev/null'" ||
  { say "installing $PACKAGES in the chroot failed"; exit 1; }
{
  echo "packages: $PACKAGES"
  for p in $RECORD; do chroot "$ROOT" dpkg-query -W -f='${Package} ${Version}\n' "$p"; done
} > "$ROOT/versions.txt.new"
mv "$ROOT/versions.txt.new" "$ROOT/versions.txt"
say "ready: $ROOT ($(sed -n 2,3p "$ROOT/versions.txt" | tr '\n' ' '), $(du -sh "$ROOT" | cut -f1))"

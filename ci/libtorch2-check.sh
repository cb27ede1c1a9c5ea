#!/usr/bin/env bash
# Builds and tests the project against LibTorch 2.x without a GPU: a Debian trixie chroot
# (debootstrap) with trixie's libtorch-dev 2.6, the same sources, the CPU test suite.
# CUDA=1 compiles instead against trixie's CUDA build of LibTorch (libtorch-cuda-dev with NVIDIA's
# toolkit from contrib/non-free, ~3 GB), so the CUDA-only code (the CUDA graph decode path, the
# kernel counter) is compiled before a GPU session spends time on it. That install cannot finish
# here (nvidia-cudnn downloads cuDNN from NVIDIA when configured), but the files are unpacked, which
# is enough to compile; the programs are linked without cuDNN and not run.
# Never run by CI: it downloads a system.
#   [CUDA=1] [ROOT=build/trixie-root] [TESTS='-LE slow'] bash ci/libtorch2-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${ROOT:-build/trixie-root$([ "${CUDA:-0}" = 1 ] && echo -cuda || true)}
TESTS=${TESTS:--LE slow}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
log() { echo "libtorch2-check: $*"; }
command -v debootstrap >/dev/null || apt-get install -y -q --no-install-recommends debootstrap >/dev/null
if [ ! -f "$ROOT/etc/debian_version" ]; then
  log "debootstrap trixie into $ROOT"
  debootstrap --variant=minbase trixie "$ROOT" "$MIRROR" >/dev/null
fi
components=main
torch="libtorch-dev python3-torch"
# The CUDA LibTorch conflicts with python3-torch (CPU): the interop tests then skip, saying why.
if [ "${CUDA:-0}" = 1 ]; then components="main contrib non-free non-free-firmware"; torch="libtorch-cuda-dev nvidia-cuda-toolkit"; fi
echo "deb $MIRROR trixie $components" > "$ROOT/etc/apt/sources.list"
mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc" 2>/dev/null || true
trap 'umount "$ROOT/proc" 2>/dev/null || true' EXIT
log "installing $torch and the build dependencies"
chroot "$ROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -c "apt-get update -q >/dev/null &&
  apt-get install -y -q --no-install-recommends cmake g++ ninja-build pkg-config $torch libopenblas0-openmp \
    libgtest-dev librapidcheck-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev python3-regex >/dev/null" ||
  [ "${CUDA:-0}" = 1 ]  # nvidia-cudnn's configure step needs NVIDIA's servers; its files are unpacked
chroot "$ROOT" dpkg-query -W -f='${Package} ${Version}\n' libtorch-dev libtorch-cuda-dev g++ cmake 2>/dev/null || true
log "copying the working tree to $ROOT/src"
rm -rf "$ROOT/src" && mkdir -p "$ROOT/src"
tar --exclude=./build --exclude='./build-*' --exclude=./.git -cf - . | tar -xf - -C "$ROOT/src"
if [ "${CUDA:-0}" = 1 ]; then
  log "compiling against the CUDA LibTorch (every target; links skip the missing cuDNN)"
  chroot "$ROOT" bash -c "cd /src && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST >/dev/null && cmake --build build -j $(nproc)"
  exit
fi
log "building"
chroot "$ROOT" bash -c "cd /src && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build -j $(nproc)"
log "testing: ctest $TESTS"
# TESTS split on spaces only, so a regex such as '-R Speculative|Rope' reaches ctest as one word.
chroot "$ROOT" env TESTS="$TESTS" bash -c 'read -ra args <<< "$TESTS"; cd /src/build &&
  OMP_WAIT_POLICY=PASSIVE ctest -j '"$(nproc)"' --output-on-failure "${args[@]}"'

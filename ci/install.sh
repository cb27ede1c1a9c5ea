#!/usr/bin/env bash
# Installs the Debian 12 packages tinygpt-verify builds and tests with. Idempotent: installs only
# what is missing, and skips apt-get entirely when everything is present. With --engines (the test
# command's), also what ci/engines.sh fetches the real engines with: npm and git.
set -euo pipefail

PACKAGES=(
  cmake g++ ninja-build pkg-config
  libtorch-dev libopenblas0-openmp   # without OpenBLAS, LibTorch's matmuls use reference BLAS (~17x slower)
  libgtest-dev librapidcheck-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libutf8proc-dev
  python3-torch python3-regex        # an independent PyTorch for the interop tests
  bible-kjv                          # the fixture corpus (SPEC 9)
  chromium                           # headless, renders the HTML report in its test
  dpkg-dev                           # dpkg-shlibdeps: the .deb's run-time dependencies (cpack)
  ccache                             # ci/build.sh compiles through it: a rebuild on the same machine is minutes shorter
)
if [ "${1:-}" = "--engines" ]; then
  # ci/engines.sh: the engines' npm packages, llama.cpp's source bundle. A command already on the PATH
  # is kept, whoever installed it (NodeSource's nodejs carries its own npm and conflicts with Debian's).
  command -v npm >/dev/null || PACKAGES+=(npm)
  command -v git >/dev/null || PACKAGES+=(git)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

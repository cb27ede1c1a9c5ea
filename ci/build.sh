#!/usr/bin/env bash
# Configures and builds Release into build/ (the command line lands at build/bin/tinygpt).
# Extra arguments go to CMake's configure step.
# Compiles through ccache when it is installed (ci/install.sh installs it): a second build of the same
# sources - a fresh clone on the same machine, CI's next run - takes the objects from the cache. The
# sloppiness lets it cache the precompiled LibTorch headers (ccache's manual, "Precompiled headers"),
# and the base folder keeps the clone's path out of the key. TINYGPT_CCACHE=0 compiles without it.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
launcher=()
if [ "${TINYGPT_CCACHE:-1}" = 1 ] && command -v ccache >/dev/null; then
  launcher=("-DCMAKE_CXX_COMPILER_LAUNCHER=env;CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime;CCACHE_BASEDIR=$PWD;ccache")
  ccache --zero-stats >/dev/null 2>&1 || true
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "$@"
cmake --build build -j "$JOBS"
if [ ${#launcher[@]} -gt 0 ]; then
  echo "build: ccache $(ccache --print-stats 2>/dev/null | awk -F'\t' '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" {h += $2} $1 == "cache_miss" {m = $2} END {printf "%d hits, %d misses", h, m}')"
fi

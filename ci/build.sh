#!/usr/bin/env bash
# Configures and builds Release into build/ (the command line lands at build/bin/tinygpt).
# Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build -j "$JOBS"

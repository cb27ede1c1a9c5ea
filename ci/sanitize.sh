#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer over our code: builds into build-asan/ (GCC,
# -fsanitize=address,undefined on every target of ours; LibTorch itself is not instrumented) and
# runs the unit, check and cli tests. Extra arguments go to ctest. Not run by CI (a second full
# build); exits non-zero on any sanitizer report or failing test.
#
# Suppressions, each justified:
# - detect_leaks=0: LibTorch and OpenBLAS keep process-lifetime allocations (thread pools,
#   registries, the default generator) that LeakSanitizer reports at exit; none is ours.
# - ci/ubsan.supp: empty unless a report comes from LibTorch's own headers (none seen so far).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTINYGPT_SANITIZE=address,undefined >/dev/null
cmake --build build-asan --target tinygpt unit_model interop_files check_harness  # what the selected tests run
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1:suppressions=$PWD/ci/ubsan.supp}
export OMP_WAIT_POLICY=PASSIVE
cd build-asan
ctest -j "${JOBS:-$(nproc)}" --output-on-failure -L "unit|check|cli" -LE "slow|cuda|install|conformance" \
  --timeout 1800 "$@"

#!/usr/bin/env bash
# Quick start, step 2: the whole test suite through ctest, JUnit XML at build/test-results.xml.
# Installs and builds first (both are no-ops when already done). Extra arguments go to ctest,
# e.g. `bash ci/test.sh -L property`. Ends with what the run cost: the slowest tests, the sum per
# label, the whole command's time, and any test over the 120 s budget without a reason in its CMake
# line (ci/test-times.py; each test's wall and CPU seconds are in build/test-times/).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
bash ci/install.sh --engines
bash ci/build.sh
# The real engines (npm, the forky chroot) from the machine's cache, fetched or made once: their tests
# skip, saying why, when they cannot be had.
bash ci/engines.sh || echo "test: the engines could not be fetched or built; ctest -L engine will skip them"
setup=$(( $(date +%s) - start ))
cd build
rm -rf test-times
# Tests run side by side: OpenMP threads wait passively instead of spinning for the core (see tests/CMakeLists.txt).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
status=0
ctest -j "${JOBS:-$(nproc)}" --output-on-failure --output-junit test-results.xml "$@" || status=$?
total=$(( $(date +%s) - start ))
echo
echo "test: install, build and engines $((setup / 60)) min $((setup % 60)) s; ctest $(( (total - setup) / 60)) min $(( (total - setup) % 60)) s"
python3 ../ci/test-times.py . --top 30 --wall "$total" --json test-times.json || true
exit $status

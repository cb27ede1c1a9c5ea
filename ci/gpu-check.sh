#!/usr/bin/env bash
# One command for a GPU machine like the lent H200 (Python with a CUDA PyTorch, CMake, ninja, nvcc;
# no package registry, no GoogleTest/RapidCheck/CLI11/nlohmann_json/PCRE2 development files):
# unpacks the packages ci/gpu-deps.sh fetched into a private prefix (never into /), builds against
# the PyTorch install's LibTorch, then runs the CUDA cases (ctest -L cuda: the properties and the
# checks), the equivalence check and the fault matrix with --device cuda, the CPU-versus-CUDA check,
# kernels per decode step, and the bench on CUDA (ours and the series' loop). Every step runs even
# when one fails; results land in $OUT (or build-gpu/results): results.md, log.txt and five JSON
# reports (seven files: the device tool brings back at most eight).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-build-gpu/results}
mkdir -p "$OUT"
RES="$OUT/results.md"
PREFIX=$PWD/build-gpu/prefix
BUILD=build-gpu/build
JOBS=${JOBS:-$(nproc)}
status=0
BUDGET=${BUDGET:-470}  # seconds: later steps are skipped past it (a lease's run is limited)
step() {  # step NAME COMMAND...: runs it, logs it, records its verdict and time
  local name=$1; shift
  local t0=$(date +%s)
  if [ $(( t0 - START )) -gt "$BUDGET" ]; then
    echo "| $name | skipped (past the ${BUDGET} s budget) | - |" >>"$RES"
    return 0
  fi
  echo "== $name" | tee -a "$OUT/log.txt"
  "$@" >>"$OUT/log.txt" 2>&1
  local rc=$?
  echo "| $name | $([ $rc = 0 ] && echo ok || echo "FAILED ($rc)") | $(( $(date +%s) - t0 )) s |" >>"$RES"
  [ $rc = 0 ] || status=1
  return $rc
}
{
  echo "# ci/gpu-check.sh, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  nvcc --version 2>&1 | tail -1
  echo "$(nproc) CPU cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo '```'
  echo
  echo "| step | verdict | time |"
  echo "| --- | --- | --- |"
} >"$RES"

mkdir -p "$PREFIX"
for f in .gpu-deps/*.deb; do
  if command -v dpkg >/dev/null; then dpkg -x "$f" "$PREFIX"
  else (cd "$PREFIX" && ar p "$OLDPWD/$f" "$(ar t "$OLDPWD/$f" | grep '^data.tar')" | tar -xJf - 2>/dev/null ||
        ar p "$OLDPWD/$f" "$(ar t "$OLDPWD/$f" | grep '^data.tar')" | tar -xf -); fi
done
export LD_LIBRARY_PATH="$PREFIX/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
TORCH_DIR=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')/Torch
step configure cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTorch_DIR="$TORCH_DIR" \
  -DCMAKE_PREFIX_PATH="$PREFIX/usr" -DPCRE2_INCLUDE_DIR="$PREFIX/usr/include" \
  -DPCRE2_LIBRARY="$PREFIX/usr/lib/x86_64-linux-gnu/libpcre2-8.so.0" -DCMAKE_CUDA_ARCHITECTURES=90
# -k 0: a target that fails leaves the others to build and run.
step build cmake --build "$BUILD" -j "$JOBS" --target tinygpt cuda_checks sampler_properties kernel_count -- -k 0
T="$BUILD/bin/tinygpt"
FIX=golden/fixture.safetensors
step ctest-cuda bash -c "cd $BUILD && ctest -L cuda -j 4 --output-on-failure --timeout 240"
step kernels timeout 120 "$BUILD/bin/kernel_count"
step bench timeout 150 "$T" bench --device cuda --batch 1,16 --tokens 64,256,1024 --cache rolling,static,cuda-graph --profile \
  --json "$OUT/bench.json"
step series-bench timeout 150 python3 tests/interop/series_bench.py --device cuda --batch 1,16 --tokens 64,256,1024 \
  --json "$OUT/series.json" --kernels
step cross-device timeout 120 bash -c "for c in rolling static cuda-graph; do $T cross-device --device cuda --cache \$c --tokens 256 --json $OUT/cross.json || exit 1; done"
step equivalence timeout 90 "$T" equivalence --device cuda --checkpoint "$FIX" --cache cuda-graph --tokens 600 --json "$OUT/equivalence.json"
step fault-matrix timeout 200 "$T" inject --device cuda --checkpoint "$FIX" --tokens 300 --json "$OUT/inject.json"
{
  echo
  echo "log: log.txt; total $(( $(date +%s) - START )) s"
  echo
  echo '```'
  grep -A 40 "^== bench" "$OUT/log.txt" | grep -v "^== series" | head -40
  grep -A 12 "^== kernels" "$OUT/log.txt" | head -12
  grep -A 12 "^== series-bench" "$OUT/log.txt" | head -12
  echo '```'
} >>"$RES"
cat "$RES"
exit $status

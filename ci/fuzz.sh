#!/usr/bin/env bash
# libFuzzer on the loaders: `bash ci/fuzz.sh [SECONDS]` (default 60 per target) builds the targets in
# fuzz/ with clang, AddressSanitizer and UndefinedBehaviorSanitizer into build-fuzz/, runs each from
# its seed corpus (fuzz/corpus/<target>, copied: the repository's seeds stay as they are) and
# prints executions and crashes per target. Exits 1 when any target found a crash (its input is
# under build-fuzz/crashes/<target>/: fix it and add it to the bad-input test). Not run by CI.
# TARGETS="safetensors tokenizer" picks targets (two invocations with disjoint TARGETS can share
# the two cores; build first with BUILD_ONLY=1, then start them with NO_BUILD=1). The protocol
# target keeps its corpus in the repository: what a run found that reaches new code is merged
# (minimised, libFuzzer's -merge=1) into fuzz/corpus/conform_protocol.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
command -v clang++ >/dev/null || apt-get install -y --no-install-recommends clang
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DTINYGPT_BUILD_CHECKS=ON -DTINYGPT_BUILD_TESTS=OFF -DTINYGPT_BUILD_FUZZ=ON \
  -DTINYGPT_SANITIZE=address,undefined,fuzzer-no-link >/dev/null
targets=${TARGETS:-safetensors torch_checkpoint tokenizer gguf golden conform_protocol}
[ "${NO_BUILD:-0}" = 1 ] || cmake --build build-fuzz --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
summary=build-fuzz/summary-$(echo $targets | tr ' ' '-').txt
# LibTorch is not instrumented; its one-time static allocations are not ours to report.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
status=0
printf '%-20s %12s %8s %8s %8s\n' target executions crashes seconds corpus > "$summary"
for t in $targets; do
  rm -rf "build-fuzz/corpus/$t" && mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  cp fuzz/corpus/$t/* "build-fuzz/corpus/$t/"
  log=build-fuzz/fuzz_$t.log
  set +e
  build-fuzz/bin/fuzz_$t -max_total_time="$SECONDS_PER_TARGET" -rss_limit_mb=4096 -max_len=65536 -timeout=20 \
    -artifact_prefix="build-fuzz/crashes/$t/" "build-fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
  [ -n "$execs" ] || execs=$(grep -Eo '#[0-9]+' "$log" | tail -1 | tr -d '#')
  crashes=$(find "build-fuzz/crashes/$t" -type f | wc -l)
  corpus=$(find "build-fuzz/corpus/$t" -type f | wc -l)
  printf '%-20s %12s %8s %8s %8s\n' "$t" "${execs:-?}" "$crashes" "$SECONDS_PER_TARGET" "$corpus" >> "$summary"
  if [ "$t" = conform_protocol ] && [ "$crashes" -eq 0 ]; then
    build-fuzz/bin/fuzz_$t -merge=1 "fuzz/corpus/$t" "build-fuzz/corpus/$t" >"build-fuzz/merge_$t.log" 2>&1 || true
  fi
  if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
    status=1
    echo "fuzz: $t found a problem (exit $rc); see $log and build-fuzz/crashes/$t/" >&2
    grep -m3 -E "ERROR|SUMMARY|runtime error" "$log" >&2 || true
  fi
done
cat "$summary"
exit $status

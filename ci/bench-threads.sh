#!/usr/bin/env bash
# How OpenMP's idle threads should wait (docs/perf.md, "Waiting threads"): in one sitting, decode at 1
# and 2 threads (bench --thread-sweep, batch 1 and 16, best of REPS) and `tinygpt verify` alone and
# beside one busy process, under tinygpt's own choice (a bounded spin, GOMP_SPINCOUNT=10000) and under
# the pure passive wait it replaced (GOMP_SPINCOUNT=0). Outside CI: it needs an idle machine.
#   [REPS=3] [BUSY="nice -n 10 sh -c 'while :; do :; done'"] bash ci/bench-threads.sh [build/bin/tinygpt]
set -euo pipefail
cd "$(dirname "$0")/.."
TINYGPT=${1:-build/bin/tinygpt}
REPS=${REPS:-3}
BUSY=${BUSY:-"nice -n 10 sh -c 'while :; do :; done'"}
export TINYGPT_REFERENCE_CACHE=
unset OMP_WAIT_POLICY
best() {  # cache batch threads over REPS sweeps -> best tok/s per (batch, threads)
  local spins=$1 out
  for _ in $(seq "$REPS"); do
    GOMP_SPINCOUNT=$spins "$TINYGPT" bench --batch 1,16 --tokens 1024 --cache static --no-uncached --thread-sweep 1,2 \
      --checkpoint golden/fixture.safetensors 2>/dev/null | awk '$1 == "static" {print $2, $4, $6}'
  done | sort -k1,1n -k2,2n -k3,3n | awk '{b[$1" "$2] = $3} END {for (k in b) print k, b[k]}' | sort -n
}
verify_s() {
  local start end
  start=$(date +%s.%N)
  GOMP_SPINCOUNT=$1 "$TINYGPT" verify --json /tmp/bench-threads-verify.json >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc
}
for spins in 10000 0; do
  echo "GOMP_SPINCOUNT=$spins (with OMP_WAIT_POLICY=PASSIVE):"
  best "$spins" | awk '{r[$1" "$2] = $3; print "  decode batch " $1 ", " $2 " thread(s): " $3 " tok/s"} END {
    printf "  batch 1: 2 threads %.2fx 1 thread; batch 16: %.2fx\n", r["1 2"] / r["1 1"], r["16 2"] / r["16 1"]}'
  alone=$(verify_s "$spins")
  # The busy loop in a process group of its own (job control: the loop and its shell end together),
  # but in the script's own session: setsid would also put it in an autogroup of its own (kernel.sched_autogroup_enabled),
  # where its nice value no longer counts against verify and the loop takes a whole core (docs/perf.md).
  set -m
  sh -c "$BUSY" & busy=$!
  set +m
  beside=$(verify_s "$spins")
  kill -- -"$busy"
  echo "  verify alone ${alone} s, beside one busy process ${beside} s: $(echo "scale=2; $beside / $alone" | bc)x"
done

#!/bin/sh
# The engine x model x row table (docs/engines.md, "Engines on the zoo"): `tinygpt conform` of each engine
# set-up on each zoo member, one at a time, each with its wall time; then the Markdown table from the JSON
# reports. Long (minutes per cell): never part of the test command.
#   ci/engine-table.sh [--setup NAME]... [--member NAME]... [--checks LIST] [--no-table] [OUT_DIR]   (default build/engine-table)
#   ci/engine-table.sh --list                     the set-ups, one per line (a CI matrix reads them)
#   ci/engine-table.sh --seed [OUT_DIR]           the seed's engine x row table instead (every adapter on
#                                                 the shipped fixture: ci/seed-engine-table.sh)
# --setup / --member pick cells (default: every set-up, every member); --no-table only writes the cells'
# reports (a CI matrix job runs one cell, a merge step runs ci/engine_table.py over all of them);
# --checks LIST runs those rows only (default all: e.g. the speculative rows alone,
# --checks spec-greedy,spec-seeded,spec-stops,spec-cache).
# Set-ups (after ci/engines.sh; one that is not there is skipped, saying so):
#   llama.cpp-0.4            npm's prebuilt llama.cpp 0.4.0 through engines/llama.cpp/adapter.cpp (GGUF)
#   llama.cpp-0.7            Debian forky's llama.cpp 0.7.0, the same adapter, in the forky chroot (root)
#   llama-server-0.7         forky's llama-server 0.7.0, the requests it schedules itself (served), in the chroot
#   wllama                   wllama 2.4.0 (llama.cpp in WebAssembly) on Node 24, one sequence (GGUF)
#   onnxruntime              onnxruntime-node 1.30.0 on the graph export_onnx.py writes of the member
#   transformers.js          transformers.js 4.3.1 on the same graph under the member's own model_type, with
#                            the positions it derives from the attention mask (as its users get them)
#   transformers.js-positions the same with positions from the adapter
#   transformers-dynamic     transformers 5.12's own classes and hybrid cache (declares no-window)
#   transformers-sliding     the same with SPEC 4's window on the full layers
#   transformers-static      its StaticCache (1,024 positions, its sliding layers as it builds them; declares no-window)
# A member an engine cannot load is a cell "refused" with its one-line reason.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
all_setups="llama.cpp-0.4 llama.cpp-0.7 llama-server-0.7 wllama onnxruntime transformers.js transformers.js-positions transformers-dynamic transformers-sliding transformers-static"
setups="" members="" table=1 out="" checks=all
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) shift; exec bash "$root/ci/seed-engine-table.sh" "$@" ;;
    --list) for s in $all_setups; do echo "$s"; done; exit 0 ;;
    --setup) setups="$setups $2"; shift 2 ;;
    --member) members="$members $2"; shift 2 ;;
    --no-table) table=0; shift ;;
    --checks) checks=$2; shift 2 ;;
    -*) echo "engine-table: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
  esac
done
[ -n "$setups" ] || setups=$all_setups
[ -n "$members" ] || members=$(cd "$root/golden/zoo" && ls)
out=${out:-$root/build/engine-table}
tinygpt=${TINYGPT_BIN:-$root/build/bin/tinygpt}  # another build: TINYGPT_BIN
mkdir -p "$out"
engine_of() {
  case "$1" in
    llama.cpp-0.4) [ -x "$root/.engines/llama.cpp/adapter" ] && echo "$root/.engines/llama.cpp/adapter" ;;
    llama.cpp-0.7) [ -x "$root/.engines/llama.cpp-0.7/adapter" ] && echo "$root/engines/forky/run.sh /suite/.engines/llama.cpp-0.7/adapter" ;;
    llama-server-0.7) [ -d "$root/.engines/forky-root/usr/lib/python3/dist-packages/gguf" ] && echo "$root/engines/llama-server/run.sh" ;;
    wllama) [ -x "$root/.engines/wllama/node/bin/node" ] && echo "$root/engines/wllama/run.sh" ;;
    onnxruntime) [ -d "$root/.engines/onnxruntime/node_modules" ] &&
      echo "TINYGPT_ORT_MODULES=$root/.engines/onnxruntime/node_modules /usr/bin/node $root/engines/onnxruntime/adapter.mjs" ;;
    transformers.js) [ -d "$root/.engines/transformers.js/node_modules" ] && echo "/usr/bin/node $root/engines/transformers.js/adapter.mjs" ;;
    transformers.js-positions) [ -d "$root/.engines/transformers.js/node_modules" ] &&
      echo "TINYGPT_TJS_POSITIONS=adapter /usr/bin/node $root/engines/transformers.js/adapter.mjs" ;;
    transformers-dynamic) [ -d "$root/.engines/forky-root" ] && echo "$root/engines/transformers/run.sh --cache dynamic" ;;
    transformers-sliding) [ -d "$root/.engines/forky-root" ] && echo "$root/engines/transformers/run.sh --cache sliding" ;;
    transformers-static) [ -d "$root/.engines/forky-root" ] && echo "$root/engines/transformers/run.sh --cache static" ;;
    *) echo "engine-table: no set-up '$1' (--list names them)" >&2; exit 2 ;;
  esac
}
for s in $setups; do
  engine=$(engine_of "$s") || true
  if [ -z "$engine" ]; then
    echo "engine-table: $s is not installed (bash ci/engines.sh): skipped" >&2
    continue
  fi
  for m in $members; do
    [ -f "$root/golden/zoo/$m/model.safetensors" ] || { echo "engine-table: no zoo member '$m'" >&2; exit 2; }
    start=$(date +%s)
    "$tinygpt" conform --engine "$engine" --model "zoo:$m" --tokens 300 --threads 1 \
      --checks "$checks" --json "$out/$s.$m.json" > "$out/$s.$m.log" 2>&1 || true
    secs=$(( $(date +%s) - start ))
    echo "$secs" > "$out/$s.$m.time"  # one file a cell: a CI matrix's artifacts merge without clashing
    echo "engine-table: $s $m $secs s" >&2
  done
done
if [ "$table" = 1 ]; then
  /usr/bin/python3 "$root/ci/engine_table.py" "$out" > "$out/table.md"
  cat "$out/table.md"
fi

#!/bin/sh
# The engine x model x row table (docs/engines.md, "Engines on the zoo"): `tinygpt conform` of each engine
# set-up on each zoo member, one at a time, each with its wall time; then the Markdown table from the JSON
# reports. Long (minutes per cell): never part of the test command.
#   ci/engine-table.sh [OUT_DIR]        (default build/engine-table)
# Engines: transformers 5.12 in the forky chroot (ci/forky.sh) through its own classes, with its own
# hybrid cache (dynamic: declares no-window, runs inside the window) and with SPEC 4's window on the full
# layers (sliding). Members: golden/zoo/*.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/engine-table}
tinygpt=$root/build/bin/tinygpt
mkdir -p "$out"
for cache in dynamic sliding; do
  for dir in "$root"/golden/zoo/*/; do
    m=$(basename "$dir")
    start=$(date +%s)
    "$tinygpt" conform --engine "$root/engines/transformers/run.sh --cache $cache" --model "zoo:$m" --tokens 300 --threads 1 \
      --checks all --json "$out/transformers-$cache.$m.json" > "$out/transformers-$cache.$m.log" 2>&1 || true
    echo "transformers-$cache $m $(( $(date +%s) - start )) s" | tee -a "$out/times.txt"
  done
done
/usr/bin/python3 "$root/ci/engine_table.py" "$out" > "$out/table.md"
cat "$out/table.md"

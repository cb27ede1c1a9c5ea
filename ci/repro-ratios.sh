#!/usr/bin/env bash
# The shrink of `conform --repro` on every planted fault of the example engine that a bundle can carry
# (faults of the requests a row sends by id; the sampler's, generate's and speculate's cannot be replayed):
# each fault's rows run, a bundle per failing row, repro.py run on the faulty and the correct engine
# (tests/conform/repro_bundle.py), and a markdown table of requests before -> after on stdout - the table in
# docs/checks.md, "Reproductions". Needs a build; about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
TINYGPT=${TINYGPT:-build/bin/tinygpt}
ENGINE="/usr/bin/python3 $PWD/engines/reference/python_reference.py"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
#  fault | its rows (the rows engines/reference/faults.txt runs it with, without the ones it passes)
while IFS='|' read -r fault checks; do
  [ -z "$fault" ] && continue
  echo "repro-ratios: $fault" >&2
  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/conform/repro_bundle.py "$TINYGPT" "$ENGINE" "$fault" --ratio-json "$out" -- \
    --tokens 40 --threads 1 --checks "$checks" --repro-budget 120 > /dev/null || echo "repro-ratios: $fault: FAILED" >&2
done <<'LIST'
rope-offset|tokens,logits
topleft-mask|tokens,logits
no-reset|tokens,reset
chunk-positions-restart|chunked-prefill
reused-prefix-too-long|prefix-reuse
position-by-request|churn
restore-position-from-window|save-restore
live-row-reused|prefix-reuse
shifted-entries-reused|reuse-after-shift
reused-past-the-window|reuse-past-window
state-saved-without-history|rollback-after-restore
fork-shares-storage|fork,churn
released-slot-not-reset|join-leave,churn
shift-keys-not-rotated|context-shift
shift-off-by-one|context-shift
rollback-keeps-one|rollback,churn
threads-race|thread-counts
LIST
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| planted fault | row | requests: the row's -> the bundle's | candidates | seconds |")
print("|---|---|---|---|---|")
for r in rows:
    print("| `%s` | `%s` | %d -> %d | %d | %.0f |" % (r["fault"], r["row"], r["before"], r["after"], r["candidates"], r["seconds"]))
ratios = sorted(r["after"] / r["before"] for r in rows)
worst = max(rows, key=lambda r: r["after"] / r["before"])
print()
print("%d bundles; bundle/row requests: median %.3f, worst %.3f (`%s`, %d -> %d)" % (
    len(rows), statistics.median(ratios), ratios[-1], worst["row"], worst["before"], worst["after"]))
PY

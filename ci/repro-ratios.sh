#!/usr/bin/env bash
# The shrink of `conform --repro` on every planted fault of the example engine and of the llama.cpp
# adapter that a bundle can carry (faults of the requests a row sends by id and of generate's sequences;
# the sampler's and speculate's cannot be replayed): each fault's rows run, a bundle per failing row, repro.py run on
# the faulty and the correct engine (tests/conform/repro_bundle.py), and a markdown table of requests
# before -> after on stdout - the table in docs/checks.md, "Reproductions". Each llama.cpp bundle is also
# written as repro.c (engines/llama.cpp/repro_c.py) from the faulty adapter's calls and the correct one's,
# each built and run. Needs a build, and for the llama.cpp lines its adapter (ci/engines.sh) and a C
# compiler; about 10 minutes on 2 cores.
#   bash ci/repro-ratios.sh [reference|llama.cpp]...   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
TINYGPT=${TINYGPT:-build/bin/tinygpt}
engines=("$@")
[ ${#engines[@]} -gt 0 ] || engines=(reference llama.cpp)
command_of() {
  case "$1" in
    reference) echo "/usr/bin/python3 $PWD/engines/reference/python_reference.py" ;;
    llama.cpp) echo "$PWD/.engines/llama.cpp/adapter" ;;
    *) echo "repro-ratios: unknown engine $1 (reference, llama.cpp)" >&2; exit 2 ;;
  esac
}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
#  engine | fault | its rows (the rows the engine's faults.txt runs it with, without the ones it passes) | more arguments
while IFS='|' read -r engine fault checks more; do
  [ -z "$fault" ] && continue
  [[ " ${engines[*]} " == *" $engine "* ]] || continue
  cmd=$(command_of "$engine")
  if [ "$engine" = llama.cpp ] && [ ! -x "$cmd" ]; then
    echo "repro-ratios: $cmd is not built (bash ci/engines.sh)" >&2
    exit 1
  fi
  echo "repro-ratios: $engine: $fault" >&2
  # shellcheck disable=SC2086
  c=()
  [ "$engine" = llama.cpp ] && c=(--repro-c engines/llama.cpp/repro_c.py)
  OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 tests/conform/repro_bundle.py "$TINYGPT" "$cmd" "$fault" --ratio-json "$out" \
    --engine-name "$engine" "${c[@]}" -- --threads 1 --checks "$checks" --repro-budget 120 $more > /dev/null ||
    echo "repro-ratios: $engine: $fault: FAILED" >&2
done <<'LIST'
reference|rope-offset|tokens,logits|--tokens 40
reference|topleft-mask|tokens,logits|--tokens 40
reference|no-reset|tokens,reset|--tokens 40
reference|chunk-positions-restart|chunked-prefill|--tokens 40
reference|reused-prefix-too-long|prefix-reuse|--tokens 40
reference|position-by-request|churn|--tokens 40
reference|restore-position-from-window|save-restore|--tokens 40
reference|live-row-reused|prefix-reuse|--tokens 40
reference|shifted-entries-reused|reuse-after-shift|--tokens 40
reference|reused-past-the-window|reuse-past-window|--tokens 40
reference|state-saved-without-history|rollback-after-restore|--tokens 40
reference|fork-shares-storage|fork,churn|--tokens 40
reference|released-slot-not-reset|join-leave,churn|--tokens 40
reference|shift-keys-not-rotated|context-shift|--tokens 40
reference|shift-off-by-one|context-shift|--tokens 40
reference|rollback-keeps-one|rollback,churn|--tokens 40
reference|threads-race|thread-counts|--tokens 40
reference|joined-at-batch-position|served|--tokens 40
llama.cpp|rope-permutation-skipped|tokens,logits|--tokens 40
llama.cpp|no-reset|tokens,reset|--tokens 40
llama.cpp|one-entry-too-few|window-reference|--tokens 300
llama.cpp|context-shift-keeps-prompt|window-reference|--tokens 300
llama.cpp|never-trimmed|window-reference,teacher-forced|--tokens 300
llama.cpp|f16-cache|self|--tokens 300 --self-stride 16
llama.cpp|rollback-forgets-the-window|rollback|
llama.cpp|reused-prefix-too-long|prefix-reuse|
llama.cpp|shift-not-renumbered|context-shift|
llama.cpp|shift-shares-cells|churn|
llama.cpp|extend-last-token-dropped|chunked-prefill|
llama.cpp|state-saved-in-part|save-restore|
llama.cpp|state-saved-without-history|rollback-after-restore|
llama.cpp|kv-heads-interleaved|logits,window-reference|--model zoo:llama
llama.cpp|final-softcap-dropped|logits,window-reference|--model zoo:gemma2
LIST
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| engine | planted fault | row | requests: the row's -> the bundle's | candidates | seconds | repro.c: faulty / correct calls |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    c = "exit %d / exit %d" % (r["c_faulty"], r["c_correct"]) if "c_faulty" in r else "-"
    print("| %s | `%s` | `%s` | %d -> %d | %d | %.0f | %s |" % (r["engine"], r["fault"], r["row"], r["before"], r["after"], r["candidates"], r["seconds"], c))
print()
for name in sorted({r["engine"] for r in rows}, key=lambda e: e != "reference"):
    mine = [r for r in rows if r["engine"] == name]
    ratios = sorted(r["after"] / r["before"] for r in mine)
    worst = max(mine, key=lambda r: r["after"] / r["before"])
    print("%s: %d bundles; the bundle's requests over the row's: median %.3f, worst %.3f (`%s`, %d -> %d)  " % (
        name, len(mine), statistics.median(ratios), ratios[-1], worst["row"], worst["before"], worst["after"]))
PY

#!/usr/bin/env bash
# docs/findings/: each engine finding of docs/engines.md ("Engines on the zoo") that a sequence of row
# requests shows, as the bundle `tinygpt conform --repro` writes for it - REPORT.md, requests.json and
# repro.py - with the same calls as a C program against llama.cpp's API (repro.c and expected.h, from
# engines/llama.cpp/repro_c.py) and the finding's context from ci/findings/NAME.md after the report. The
# model file is left out (a zoo member: requests.json's "export" writes it again; tests/engines/findings.py
# does before it replays each bundle). Needs a build and the llama.cpp adapter (ci/engines.sh). Run from anywhere.
# llama-server's truncation (finding 5) is a request the server schedules itself ('generate'), replayed
# through engines/llama-server/run.sh (Debian forky's llama-server, in the chroot ci/forky.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
TINYGPT=${TINYGPT:-build/bin/tinygpt}
LLAMA=.engines/llama.cpp/adapter
[ -x "$LLAMA" ] || { echo "findings: $LLAMA is not built (bash ci/engines.sh)" >&2; exit 1; }
#        folder | member | rows run | the row whose bundle it is (the row that sent the requests) | more arguments
#        | the engine (default: the llama.cpp adapter)
# Finding 4 (a rollback after a shift on gemma2's sliding layers, seen in churn) keeps a shift and a
# truncate of the wrong row: without them its churn shrinks to finding 3's restore-then-truncate, which
# fails the same way.
findings=(
  "llama-sliding-window-ignored|zoo:mistral|tokens,logits|tokens"
  "k-shift-reapplies-yarn-factor|zoo:qwen3|join-leave,context-shift|context-shift"
  "saved-state-leaves-out-sliding-cells|zoo:gemma2|join-leave,save-restore,rollback-after-restore|rollback-after-restore"
  "rollback-after-shift-on-sliding-layers|zoo:gemma2|context-shift,churn|churn|--repro-keep shift,truncate"
  "llama-server-truncates-past-the-window|zoo:gemma2|served|served||engines/llama-server/run.sh"
)
mkdir -p docs/findings
index="docs/findings/README.md.new"
trap 'rm -f "$index"' EXIT
{
  echo "# Engine findings as reproductions"
  echo
  echo "Each folder is what \`tinygpt conform --repro DIR\` wrote for a finding of docs/engines.md: REPORT.md (the"
  echo "paragraph for the engine's maintainers, then the requests), requests.json (each request with the reference's"
  echo "answer) and repro.py (Python's standard library and the engine: exit 1 while the bug is there, 0 once it is"
  echo "fixed); llama.cpp's with repro.c: the llama.cpp calls that answered the requests as a C program against its"
  echo "API, the reference's logits in expected.h (engines/llama.cpp/repro_c.py; the build line is in REPORT.md). The"
  echo "model is left out: \`requests.json\`'s \"export\" command writes it (from the repository root, into the folder)."
  echo "\`engine.Finding.*\` replays each against its engine (and builds and runs its repro.c), and fails once one is"
  echo "fixed."
  echo "Written by ci/findings.sh."
  echo
  echo "| finding | member | requests (row's -> bundle's) | first wrong answer |"
  echo "|---|---|---|---|"
} > "$index"
for f in "${findings[@]}"; do
  IFS='|' read -r name model checks row more engine <<< "$f"
  engine=${engine:-$LLAMA}
  tmp=$(mktemp -d)
  echo "findings: $name ($model: $checks)" >&2
  "$TINYGPT" conform --engine "$engine" --model "$model" --checks "$checks" --threads 1 --repro "$tmp/b" --repro-budget 300 \
    --json "$tmp/report.json" $more > "$tmp/log" 2>&1 || true
  if [ ! -f "$tmp/b/$row/requests.json" ]; then
    tail -20 "$tmp/log" >&2
    echo "findings: $name: no bundle for $row" >&2
    exit 1
  fi
  # The same calls without the adapter: repro.c against llama.cpp's C API, built and run here.
  if [ "$engine" = "$LLAMA" ]; then python3 engines/llama.cpp/repro_c.py write "$tmp/b/$row" --adapter "$LLAMA" >&2; fi
  rm -rf "docs/findings/$name"
  mkdir -p "docs/findings/$name"
  cp "$tmp/b/$row/REPORT.md" "$tmp/b/$row/requests.json" "$tmp/b/$row/repro.py" "docs/findings/$name/"
  for f in repro.c expected.h; do if [ -f "$tmp/b/$row/$f" ]; then cp "$tmp/b/$row/$f" "docs/findings/$name/"; fi; done
  if [ -f "ci/findings/$name.md" ]; then cat "ci/findings/$name.md" >> "docs/findings/$name/REPORT.md"; fi
  python3 - "$tmp/b/$row/requests.json" "$name" "${model#zoo:}" >> "$index" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
s = d["shrunk"]
print("| [%s](%s/REPORT.md) | %s | %d -> %d | %s |" % (sys.argv[2], sys.argv[2], sys.argv[3], s["requests_before"], s["requests_after"],
                                                   d["failure"]["says"].replace("|", "\\|")))
PY
  rm -rf "$tmp"
done
mv "$index" docs/findings/README.md
echo "findings: docs/findings/ written" >&2

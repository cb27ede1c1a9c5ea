#!/usr/bin/env bash
# The seed's engine table of docs/engines.md ("Measured"; `ci/engine-table.sh --seed` runs this), measured: `tinygpt conform` with its defaults (600 tokens,
# every check) on every engine adapter that is built (ci/engines.sh; --exact for llama.cpp with exact
# GELU), one at a time, and one Markdown row each with the wall time. Needs build/bin/tinygpt.
# Usage: [ONLY=TEXT] [REUSE=1] bash ci/seed-engine-table.sh [OUT_DIR]   (the JSON reports land there;
# default build/engine-table; ONLY runs just the adapters whose label contains TEXT; REUSE=1 keeps
# the reports an earlier run left there, with their wall times, and runs only the missing ones)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/engine-table}
mkdir -p "$OUT"
T=build/bin/tinygpt
labels=()
run() {  # label command...
  local label=$1
  shift
  case "$label" in *"${ONLY:-}"*) ;; *) return 0 ;; esac
  local json="$OUT/$(echo "$label" | tr ' /()' '____').json" start end
  if [ -z "${REUSE:-}" ] || [ ! -s "$json" ] || [ ! -s "$json.wall" ]; then
    start=$(date +%s.%N)
    "$T" conform --engine "$*" --json "$json" > "$OUT/last.log" 2>&1 || true
    end=$(date +%s.%N)
    echo "$end - $start" | bc > "$json.wall"
  fi
  labels+=("$label")
  echo "engine-table: $label done" >&2
}
[ -x .engines/llama.cpp/adapter ] && run "llama.cpp (npm prebuilt)" .engines/llama.cpp/adapter
[ -x .engines/llama.cpp-0.7/adapter ] && run "llama.cpp 0.7.0 (Debian forky)" engines/forky/run.sh /suite/.engines/llama.cpp-0.7/adapter
[ -x .engines/llama.cpp-exact/adapter ] && run "llama.cpp with exact GELU" .engines/llama.cpp-exact/adapter
[ -d .engines/onnxruntime/node_modules ] &&
  TINYGPT_ORT_MODULES=$PWD/.engines/onnxruntime/node_modules run "ONNX Runtime (onnxruntime-node)" /usr/bin/node engines/onnxruntime/adapter.mjs
if [ -d .engines/transformers.js/node_modules ]; then
  run "transformers.js, its own positions" /usr/bin/node engines/transformers.js/adapter.mjs
  run "transformers.js, positions from the adapter" TINYGPT_TJS_POSITIONS=adapter /usr/bin/node engines/transformers.js/adapter.mjs
fi
if [ -f .engines/forky-root/versions.txt ]; then
  run "transformers, sliding-window cache" engines/transformers/run.sh --cache sliding
  run "transformers, DynamicCache" engines/transformers/run.sh --cache dynamic
  [ -d .engines/forky-root/usr/lib/python3/dist-packages/gguf ] && run "llama-server 0.7.0 (Debian forky)" engines/llama-server/run.sh
fi
[ -x .engines/wllama/node/bin/node ] && run "wllama (npm, Node 24)" engines/wllama/run.sh
run "python reference (python3-torch)" /usr/bin/python3 engines/reference/python_reference.py
# One Markdown row per adapter run here; then every engine against every row: one column per adapter,
# the verdict of each row of the table (the sampler rows in one cell: how many passed of those run).
/usr/bin/python3 - "$OUT" "${labels[@]}" <<'EOF'
import json, os, sys
out, labels = sys.argv[1], sys.argv[2:]
def judged(r, digits):  # the figure a row was judged by: mean KL where its bound is one, else max |diff|
    st = (r or {}).get("stats") or {}
    if "KL" in ((r or {}).get("bound") or "") and "kl_mean" in st:
        return "KL %.*e" % (digits, st["kl_mean"])
    return "%.*e" % (digits, st["max_abs_diff"]) if "max_abs_diff" in st else ""
bound = lambda r: (r.get("bound") or "-").replace("max |diff| <= ", "").replace("|", "\\|") if r else "-"
docs = []
print("| adapter | engine | rows | verdict | worst \\|diff\\| (bound) | declared | conform wall |")
print("| --- | --- | --- | --- | --- | --- | ---: |")
for label in labels:
    path = os.path.join(out, "".join("_" if c in " /()" else c for c in label) + ".json")
    if not os.path.exists(path):
        continue
    d = json.load(open(path))
    rows = {r["check"]: r for r in d["checks"]}
    docs.append((label, rows))
    passed = sum(r["status"] == "pass" for r in d["checks"])
    failed = [r["check"] for r in d["checks"] if r["status"] in ("fail", "error")]
    skipped = sum(r["status"] == "skipped" for r in d["checks"])
    logits, self_ = rows.get("logits"), rows.get("self")
    verdict = "pass" if d["passed"] else "FAIL: " + ", ".join(failed)
    print("| %s | %s | %d passed, %d skipped | %s | logits %s (%s); self %s (%s) | %s | %.0f s |" % (
        label, d["engine"], passed, skipped, verdict, judged(logits, 2) or "-", bound(logits), judged(self_, 2) or "-",
        bound(self_), ", ".join(d.get("deviations") or []) or "-", float(open(path + ".wall").read())))
print()
names = []
for _, rows in docs:
    for n in rows:
        if n not in names and not n.startswith("sampler/") and not n.startswith("declared:") and n != "sampler":
            names.append(n)
def cell(r):  # the verdict, and a pass's figure
    if r is None:
        return "-"
    fig = judged(r, 1)
    return {"pass": "pass", "fail": "**FAIL**", "error": "**ERROR**", "skipped": "skip"}[r["status"]] + (" " + fig if fig and r["status"] == "pass" else "")
print("| row | " + " | ".join(l for l, _ in docs) + " |")
print("| --- |" + " --- |" * len(docs))
for n in names:
    print("| `%s` | " % n + " | ".join(cell(rows.get(n)) for _, rows in docs) + " |")
sampler = []
for _, rows in docs:
    s = [r for k, r in rows.items() if k.startswith("sampler/")]
    sampler.append("%d of %d pass" % (sum(r["status"] == "pass" for r in s), len(s)) if s else "no sampler")
print("| sampler rows | " + " | ".join(sampler) + " |")
EOF

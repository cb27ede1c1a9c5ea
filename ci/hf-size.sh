#!/bin/bash
# What verify costs on a model of the size people run (docs/perf.md, "A Hugging Face directory at the size
# people run"): transformers (in the forky chroot, ci/forky.sh) writes a randomly initialised directory
# shaped like SmolLM2-135M (ci/hf_size_model.py) with its own greedy continuation; then `tinygpt verify
# --checkpoint DIR` runs at each level below, each timed with its peak memory (GNU time), and its
# greedy ids are compared with transformers'.
#   ci/hf-size.sh [BUILD_DIR] [WORK_DIR] [SHAPE] [LEVELS]
# SHAPE: smollm2-135m (default) or qwen3-0.6b. LEVELS (comma-separated, default quick,tokens-600,full-64):
#   quick       verify --quick
#   tokens-600  verify --checks tokens --faults none (the 600-token greedy run, its uncached reference first)
#   seed-faults verify --tokens 64 --checks tokens,logits,teacher-forced --faults rope-offset,topleft-mask (the
#               seed's two faults caught on this model, inside the context)
#   quick-faults verify --quick --faults all (the fault matrix inside the context: every fault that applies
#               to the model, through the rows that must catch it, at 64 tokens)
#   full-64     verify --tokens 64 (every default row, the fault matrix)
# Writes WORK_DIR/SHAPE/costs.json: per level the wall seconds, peak RSS and each row's seconds.
# Long (tens of minutes on 2 cores): never run by the test suite.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
work=${2:-/tmp/tinygpt-hf-size}
shape=${3:-smollm2-135m}
levels=${4:-quick,tokens-600,full-64}
tinygpt=$build/bin/tinygpt
dir=$work/$shape
mkdir -p "$work"
[ -x "$tinygpt" ] || { echo "hf-size: no $tinygpt (build first)" >&2; exit 2; }
[ -f "$here/.engines/forky-root/versions.txt" ] || { echo "hf-size: no forky chroot (run ci/forky.sh)" >&2; exit 2; }
if [ ! -f "$dir/transformers.json" ]; then
  # The series' tokenizer as the tokenizers library writes it (4,096 ids under the model's larger vocabulary).
  "$tinygpt" export --format hf --checkpoint "$here/golden/zoo/llama/model.safetensors" "$work/tokenizer-src" > /dev/null
  prompt=$("$tinygpt" encode --tokenizer "$work/tokenizer-src" "In the beginning God created the heaven and the earth.")
  echo "[${prompt// /,}]" > "$work/prompt.json"
  echo "hf-size: transformers writes $shape and its 600 greedy steps"
  TMPDIR=$work "$here/engines/forky/run.sh" /usr/bin/python3 /suite/ci/hf_size_model.py "$shape" "$dir" \
    "$work/tokenizer-src/tokenizer.json" "$work/prompt.json" 600
fi
export TINYGPT_REFERENCE_CACHE=$work/reference-cache
# Our greedy continuation of transformers' prompt, beside its own (the rolling cache, float32).
prompt=$(/usr/bin/python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompt'])))" "$dir/transformers.json")
/usr/bin/time -f "%e %M" -o "$work/generate.time" "$tinygpt" generate --checkpoint "$dir" --ids "$prompt" --tokens 600 --stop none --threads 2 \
  > "$work/generate.ids"
IFS=, read -ra want <<< "$levels"
for level in "${want[@]}"; do
  case $level in
    quick) args=(--quick) ;;
    tokens-600) args=(--checks tokens --faults none) ;;
    seed-faults) args=(--tokens 64 --checks tokens,logits,teacher-forced --faults rope-offset,topleft-mask) ;;
    quick-faults) args=(--quick --faults all) ;;
    full-64) args=(--tokens 64) ;;
    *) echo "hf-size: unknown level '$level'" >&2; exit 2 ;;
  esac
  echo "hf-size: verify ${args[*]} on $shape"
  set +e
  /usr/bin/time -f "%e %M" -o "$work/$level.time" "$tinygpt" verify --checkpoint "$dir" "${args[@]}" --threads 2 \
    --json "$work/$level.json" > "$work/$level.log" 2>&1
  echo "hf-size: exit $? ($(cat "$work/$level.time"))"
  set -e
done
/usr/bin/python3 - "$work" "$dir" "$levels" <<'EOF'
import json, os, sys
work, d, levels = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
hf = json.load(open(os.path.join(d, "transformers.json")))
out = {"shape": os.path.basename(d), "parameters": hf["parameters"], "transformers_600_steps_s": hf["seconds"], "levels": {}}
ours = [int(x) for x in open(os.path.join(work, "generate.ids")).read().split(",")]
same = next((i for i, (a, b) in enumerate(zip(ours, hf["greedy"])) if a != b), len(hf["greedy"]))
wall, kb = open(os.path.join(work, "generate.time")).read().split()[-2:]
out["greedy"] = {"identical_steps": same, "of": len(hf["greedy"]), "generate_600_s": float(wall), "peak_rss_mb": int(kb) // 1024}
print("greedy: the first %d of %d ids equal transformers' (generate: %s s, %d MB)" % (same, len(hf["greedy"]), wall, int(kb) // 1024))
for level in levels:
    wall, kb = open(os.path.join(work, level + ".time")).read().split()[-2:]
    rep = json.load(open(os.path.join(work, level + ".json")))
    rows = {r["check"]: round(r.get("seconds", 0), 1) for r in rep["checks"]}
    out["levels"][level] = {"wall_s": float(wall), "peak_rss_mb": int(kb) // 1024, "passed": rep["passed"], "rows_s": rows}
    print("%-10s %7.0f s  %6d MB  %s" % (level, float(wall), int(kb) // 1024, "PASS" if rep["passed"] else "FAIL"))
json.dump(out, open(os.path.join(d, "costs.json"), "w"), indent=1)
EOF

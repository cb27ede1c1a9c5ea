#!/usr/bin/env bash
# The series' own loop (our Python port of it, Debian's python3-torch) and `tinygpt bench` in one
# sitting, interleaved per cell group, and the ratios: runs on shared machines vary by up to 2x
# between sittings, so only same-run ratios mean anything. Never run by CI (minutes).
#   THREADS=2 BATCH=1,16 TOKENS=64,256,1024 bash ci/bench-vs-series.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/bench}
THREADS=${THREADS:-$(nproc)}
BATCH=${BATCH:-1,16}
TOKENS=${TOKENS:-64,256,1024}
mkdir -p "$OUT"
bash ci/build.sh >/dev/null
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $THREADS threads"
/usr/bin/python3 tests/interop/series_bench.py --threads "$THREADS" --batch "$BATCH" --tokens "$TOKENS" --json "$OUT/series.json"
build/bin/tinygpt bench --threads "$THREADS" --batch "$BATCH" --tokens "$TOKENS" --cache rolling,static --profile \
  --json "$OUT/tinygpt.json"
/usr/bin/python3 - "$OUT/series.json" "$OUT/tinygpt.json" <<'PY'
import json, sys
series = {(r["batch"], r["tokens"]): r for r in json.load(open(sys.argv[1]))["rows"]}
ours = json.load(open(sys.argv[2]))
print("\n| path | batch | tokens | series' PyTorch tok/s | tinygpt tok/s | ratio | bound tok/s | of bound |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
seen = set()
for r in ours["rows"]:
    s = series[(r["batch"], r["tokens"])]
    if (r["batch"], r["tokens"]) not in seen and r["uncached_tok_s"]:
        seen.add((r["batch"], r["tokens"]))
        print(f"| uncached | {r['batch']} | {r['tokens']} | {s['uncached_tok_s']:,.0f} | {r['uncached_tok_s']:,.0f} | {r['uncached_tok_s'] / s['uncached_tok_s']:.1f}x | | |")
    b = r.get("bound_tok_s", 0)
    print(f"| cached ({r['cache']}) | {r['batch']} | {r['tokens']} | {s['cached_tok_s']:,.0f} | {r['cached_tok_s']:,.0f} | {r['cached_tok_s'] / s['cached_tok_s']:.1f}x | {b:,.0f} | {100 * r['cached_tok_s'] / b:.0f}% |")
PY

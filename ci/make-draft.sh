#!/usr/bin/env bash
# Trains the fixture's speculative draft (docs/speculative.md; minutes on 2 cores, never run by CI): the
# seed's architecture at d_model 128 and 2 layers (`train --arch draft`) on the fixture's KJV corpus with
# the shipped tokenizer and the fixture's recipe; its best checkpoint and training log into golden/.
#   STEPS=2400 bash ci/make-draft.sh   (the shipped draft: 2,400 steps, 13 minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-2400}
WORK=${WORK:-build/draft-run}
mkdir -p "$WORK"
[ -s "$WORK/kjv.txt" ] || bible "Gen1:1-Rev22:21" > "$WORK/kjv.txt"
start=$(date +%s)
build/bin/tinygpt train --arch draft --corpus "$WORK/kjv.txt" --tokenizer golden/tokenizer.json --out "$WORK/run" \
  --steps "$STEPS" --eval-every 50 --seed 1337
cp "$WORK/run/best.safetensors" golden/draft.safetensors
cp "$WORK/run/train_log.csv" golden/draft_train_log.csv
echo "make-draft: trained in $(( $(date +%s) - start )) s"

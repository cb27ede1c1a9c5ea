#!/usr/bin/env bash
# Trains the zoo's members (docs/SPEC.md section 10; minutes each on 2 cores, never run by CI): each
# member's architecture (src: lib zoo.h) on the fixture's KJV corpus with the shipped tokenizer and the
# fixture's recipe, its best checkpoint and training log into golden/zoo/NAME/.
#   MEMBERS="llama qwen3" STEPS=600 bash ci/make-zoo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-600}
MEMBERS=${MEMBERS:-"llama mqa mistral gemma2 qwen3 neox"}
WORK=${WORK:-build/zoo-run}
mkdir -p "$WORK"
[ -s "$WORK/kjv.txt" ] || bible "Gen1:1-Rev22:21" > "$WORK/kjv.txt"
for m in $MEMBERS; do
  start=$(date +%s)
  build/bin/tinygpt train --arch "$m" --corpus "$WORK/kjv.txt" --tokenizer golden/tokenizer.json --out "$WORK/$m" \
    --steps "$STEPS" --eval-every 50 --seed 1337
  mkdir -p "golden/zoo/$m"
  cp "$WORK/$m/best.safetensors" "golden/zoo/$m/model.safetensors"
  cp "$WORK/$m/train_log.csv" "golden/zoo/$m/train_log.csv"
  echo "make-zoo: $m trained in $(( $(date +%s) - start )) s"
done

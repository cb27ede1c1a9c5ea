#!/usr/bin/env bash
# Rebuilds the shipped fixture from nothing (about an hour on 2 cores; never run by CI):
# the KJV corpus from Debian's bible-kjv, the tokenizer, the training run, then the goldens.
# STEPS=800 bash ci/make-fixture.sh
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-800}
WORK=${WORK:-build/fixture-run}
mkdir -p "$WORK"
bible "Gen1:1-Rev22:21" > "$WORK/kjv.txt"
build/bin/tinygpt train-tokenizer --corpus "$WORK/kjv.txt" --vocab 4096 --out "$WORK/tokenizer.json"
build/bin/tinygpt train --corpus "$WORK/kjv.txt" --tokenizer "$WORK/tokenizer.json" --out "$WORK/run" \
  --steps "$STEPS" --eval-every 50 --seed 1337
cp "$WORK/tokenizer.json" golden/tokenizer.json
cp "$WORK/run/best.safetensors" golden/fixture.safetensors
cp "$WORK/run/train_log.csv" golden/train_log.csv
build/bin/tinygpt golden update

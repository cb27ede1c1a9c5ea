#!/usr/bin/env bash
# Quick start, step 1: install the packages, build, and run the main job. Until `tinygpt verify`
# and the trained fixture exist, the main job is a generate demo and the seed's cache check.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
bash ci/build.sh
echo "setup: generate demo (cached, untrained weights)"
build/bin/tinygpt generate --ids 1,2,3 --tokens 16
echo "setup: the seed's cache-equivalence check"
build/bin/tinygpt equivalence --json build/equivalence.json

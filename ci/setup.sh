#!/usr/bin/env bash
# Quick start, step 1: install the packages, build, and run the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
bash ci/build.sh
echo "setup: running the main job"
build/bin/tinygpt generate --ids 1,2,3 --tokens 16

#!/usr/bin/env bash
# Quick start, step 1: install the packages, build, and run the main job (`tinygpt verify` on the
# shipped fixture; its JSON report and JUnit XML land in build/).
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/install.sh
bash ci/build.sh
build/bin/tinygpt verify --json build/verify.json --junit build/verify-junit.xml

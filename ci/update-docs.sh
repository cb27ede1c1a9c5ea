#!/usr/bin/env bash
# Rewrites docs/checks.md's generated tables from the check table (`tinygpt checks --markdown`).
# Run after changing a row of the table, a fault or a deviation; ctest's docs test fails until then.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/tinygpt ] || bash ci/build.sh
python3 tests/docs/check_docs.py build/bin/tinygpt . --write

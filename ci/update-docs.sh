#!/usr/bin/env bash
# Rewrites docs/checks.md's generated tables from the check table (`tinygpt checks --markdown`).
# Run after changing a row of the table, a fault or a deviation; ctest's docs test fails until then.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/tinygpt ] || bash ci/build.sh
python3 tests/docs/check_docs.py build/bin/tinygpt . --write
# The report's screenshot (docs/reports.md shows it): the one cli.ReportRendersInChromium took of the main
# job's report, with the counts it shows beside it (docs/report.json), which cli.ReadmeQuotesVerifysCounts
# holds against the main job's report - so a screenshot of an older table fails the suite.
if [ -f build/report.png ] && [ -f build/verify.json ] && [ build/report.png -nt build/verify.json ]; then
  cp build/report.png docs/report.png
  /usr/bin/python3 tests/docs/readme_counts.py --screenshot-counts build/verify.json > docs/report.json
  echo "docs/report.png: the screenshot of build/report.html, counts in docs/report.json"
else
  echo "docs/report.png kept: run ctest -R 'cli.(Verify|Report)' first for a screenshot newer than build/verify.json"
fi

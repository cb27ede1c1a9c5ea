#!/bin/sh
# Runs the rest of the command line when $1 exists (an engine adapter ci/engines.sh built); otherwise
# says why and exits 77, which ctest reports as skipped.
if [ ! -e "$1" ]; then
  echo "skipped: $1 is not there: run bash ci/engines.sh first (it needs the npm registry and Node.js)"
  exit 77
fi
shift
exec "$@"

#!/bin/sh
# The wllama adapter on Node 24, both as ci/engines.sh fetched them into .engines/wllama/.
here=$(cd "$(dirname "$0")/../.." && pwd)
w=$here/.engines/wllama
[ -x "$w/node/bin/node" ] || { echo "wllama: no Node 24 at $w/node (run ci/engines.sh)" >&2; exit 1; }
TINYGPT_WLLAMA=$w/package exec "$w/node/bin/node" "$here/engines/wllama/adapter.mjs" "$@"

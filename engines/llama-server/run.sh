#!/bin/sh
# The llama-server adapter inside the forky chroot (ci/forky.sh makes it), through engines/forky/run.sh.
#   engines/llama-server/run.sh [--parallel 4] [--cache-prompt on|off] [--n-probs 10] [--batch 64]
exec "$(dirname "$0")/../forky/run.sh" /usr/bin/python3 /suite/engines/llama-server/adapter.py "$@"

#!/bin/sh
# The transformers adapter inside the forky chroot (ci/forky.sh makes it), through engines/forky/run.sh.
#   engines/transformers/run.sh --cache dynamic|sliding|static
exec "$(dirname "$0")/../forky/run.sh" /usr/bin/python3 /suite/engines/transformers/adapter.py "$@"

#!/usr/bin/env bash
# Nightly: the sampler property suite with many more cases per law (default 100 in CI).
# CASES=5000 bash ci/properties-deep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/build.sh >/dev/null
CASES=${CASES:-3000}
RC_PARAMS="max_success=${CASES} max_size=200" build/bin/sampler_properties --gtest_filter='SamplerLaws/*'

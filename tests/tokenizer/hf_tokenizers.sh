#!/bin/sh
# A Hugging Face tokenizer.json read by our library against the tokenizers library itself: hf_cases.py
# (inside the forky chroot, python3-tokenizers 0.23) trains four tokenizers of the families directories
# hold and writes its answers for a corpus of tricky strings; hf_cases_check holds ours to them. Also our
# export of the series' tokenizer (`tinygpt export --format hf`): the library reads it and gives every id
# the series tokenizer gives.
#   hf_tokenizers.sh TINYGPT HF_CASES_CHECK WORK_DIR      exit 77 (skipped) where the chroot is not there
here=$(cd "$(dirname "$0")/../.." && pwd)
tinygpt=$1 check=$2 work=$3
root=${TINYGPT_FORKY_ROOT:-$here/.engines/forky-root}
if [ ! -d "$root/usr/lib/python3/dist-packages/tokenizers" ]; then
  echo "skipped: no tokenizers library: the forky chroot is not at $root (bash ci/engines.sh makes it)"
  exit 77
fi
tmp=${TMPDIR:-/tmp}
cases=$(mktemp -d "$tmp/tinygpt-hf-cases.XXXXXX") || exit 1
trap 'rm -rf "$cases"' EXIT
"$tinygpt" export --format hf --checkpoint "$here/golden/zoo/llama/model.safetensors" "$cases/export" >/dev/null || exit 1
"$here/engines/forky/run.sh" /usr/bin/python3 /suite/tests/tokenizer/hf_cases.py "$cases/cases" "series=$cases/export/tokenizer.json" || exit 1
rm -rf "$work" && mkdir -p "$work" && cp -r "$cases"/cases/. "$work"/
"$check" "$work" "series=$here/golden/tokenizer.json"

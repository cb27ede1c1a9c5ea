#!/usr/bin/env bash
# Run HERE before ci/gpu-check.sh: downloads the Debian development packages the GPU machine lacks
# (GoogleTest, RapidCheck, nlohmann_json, CLI11, PCRE2) into .gpu-deps/, an ignored folder that
# travels with the tree (the device tool's `carry`). Nothing is installed here; a few MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.gpu-deps
mkdir -p "$DEST"
cd "$DEST"
rm -f ./*.deb
# apt-get download runs as _apt where it can; a root-owned folder makes it warn and download as root.
apt-get download libgtest-dev librapidcheck-dev nlohmann-json3-dev libcli11-dev libpcre2-dev libpcre2-8-0 2>&1 |
  grep -v "unsandboxed" || true
ls -la
du -sh .

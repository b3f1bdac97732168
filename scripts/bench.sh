#!/usr/bin/env bash
# The side-by-side benchmark (direct, nginx, bare pingora, LiteLLM, Quipu) on this machine, plain
# HTTP/1.1 and, in the same run, over TLS and HTTP/2:
#
#   ./scripts/bench.sh [--quick] [--baseline REV]   # writes docs/benchmarks-<date>[-quick].md
#
# docs/benchmarks.md is the index and the dated history: add the run's findings there by hand.
#
# --baseline REV adds an earlier build of Quipu to the plain cells of the same run.
#
# Installs what it needs: nginx, wrk, ab (apache2-utils), h2load (nghttp2-client) and openssl
# (apt), oha (cargo), LiteLLM (pip, in its own venv under benches/.venv-litellm). Not a test: it
# measures, it does not pass or fail. Arguments go to benches/run.py (--sections, --streams-only …).
set -euo pipefail
cd "$(dirname "$0")/.."
QUIPU_DEPS_BUILD_ONLY=1 source scripts/deps.sh
need=()
command -v nginx >/dev/null 2>&1 || need+=(nginx)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v ab >/dev/null 2>&1 || need+=(apache2-utils)
command -v h2load >/dev/null 2>&1 || need+=(nghttp2-client)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null || true
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  $sudo systemctl stop nginx >/dev/null 2>&1 || true
fi
command -v oha >/dev/null 2>&1 || [ -x "$HOME/.cargo/bin/oha" ] || cargo install oha --locked
venv=benches/.venv-litellm
if [ ! -x "$venv/bin/litellm" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q 'litellm[proxy]==1.106.2'
fi
cargo build --release -p quipu -p quipu-sim -p bare-forwarder

# --baseline REV: an earlier build of Quipu measured in the same run (e.g. the last release, or
# the commit before a change), so a regression shows against this machine at this moment. Built
# once per revision from a temporary worktree and kept under target/bench-baseline/.
args=()
baseline=""
while [ $# -gt 0 ]; do
  case "$1" in
    --baseline) baseline="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -n "$baseline" ]; then
  rev="$(git rev-parse --short "$baseline")"
  store="${CARGO_TARGET_DIR:-$PWD/target}/bench-baseline"
  out="$store/$rev"
  if [ ! -x "$out/quipu" ]; then
    wt="$(mktemp -d)"
    git worktree add -q --detach "$wt" "$rev"
    (cd "$wt" && CARGO_TARGET_DIR="$store/build" cargo build --release -p quipu)
    mkdir -p "$out"
    cp "$store/build/release/quipu" "$out/quipu"
    git worktree remove --force "$wt"
  fi
  export QUIPU_BENCH_BASELINE="$out/quipu" QUIPU_BENCH_BASELINE_LABEL="quipu-$rev"
fi
exec python3 benches/run.py "${args[@]}"

#!/usr/bin/env bash
# Builds Quipu and runs it on its embedded defaults (or on QUIPU_CONFIG / --config):
#
#   ./scripts/run.sh                 # quipu serve
#   ./scripts/run.sh --config my.toml
#   ./scripts/run.sh --demo          # with a simulated upstream and a demo tenant (scripts/demo.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--demo" ]; then
  shift
  exec scripts/demo.sh "$@"
fi
QUIPU_DEPS_BUILD_ONLY=1 source scripts/deps.sh
cargo build --release -p quipu
exec ./target/release/quipu "$@" serve

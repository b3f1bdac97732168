#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this):
#
#   ./scripts/test.sh            # everything
#   ./scripts/test.sh --fast     # the fast tier: lints, the Rust tests, the integration smoke
#   ./scripts/test.sh -k chat    # any other argument goes to pytest (with or without --fast)
#
# Installs what is missing (scripts/deps.sh), checks formatting and lints, builds the workspace
# in release mode once, starts a throwaway PostgreSQL, then runs the Rust tests (unit, store
# suite on SQLite and PostgreSQL, translator conformance) and the Python integration suites
# (real quipu + simulator processes, official openai/anthropic SDKs, Claude Code, Prometheus, a
# real llama.cpp llama-server built from source and cached between runs).
#
# --fast runs the same lints, build and Rust tests, then only the integration tests marked
# `smoke` (pytest -m smoke; docs/testing.md says which and why), and skips llama-server: a
# few minutes at most on a warm two-core machine. CI runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
started=$(date +%s)

fast=0
pytest_args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else pytest_args+=("$arg"); fi
done

step() { printf '\n=== %s (%ss)\n' "$1" "$(( $(date +%s) - started ))" >&2; }

step "dependencies"
source scripts/deps.sh

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --release --workspace --all-targets -- -D warnings

step "build"
cargo build --release --workspace

if [ "$fast" = 0 ]; then
  step "llama-server"
  # A real llama.cpp server for tests/python/test_llama_cpp.py, built from source once per
  # machine (cached outside the repository, see the script); later runs find it at once.
  QUIPU_LLAMA_SERVER="${QUIPU_LLAMA_SERVER:-$(scripts/llama-server.sh)}"
  export QUIPU_LLAMA_SERVER
fi

step "postgresql"
pg_env="$(scripts/pg-test.sh start)"
eval "$pg_env"
trap 'scripts/pg-test.sh stop >/dev/null 2>&1 || true' EXIT

step "rust tests"
cargo test --release --workspace

if [ "$fast" = 1 ]; then
  step "integration smoke"
  "$root/.venv/bin/python" -m pytest -q -p no:cacheprovider -m smoke tests/python ${pytest_args[@]+"${pytest_args[@]}"}
else
  step "integration tests"
  "$root/.venv/bin/python" -m pytest -q -p no:cacheprovider tests/python ${pytest_args[@]+"${pytest_args[@]}"}
fi

step "done"

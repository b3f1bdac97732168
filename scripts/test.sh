#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (.ci/run calls this):
#
#   ./scripts/test.sh
#
# Installs what is missing (scripts/deps.sh), checks formatting and lints, builds the workspace
# in release mode once, starts a throwaway PostgreSQL, then runs the Rust tests (unit, store
# suite on SQLite and PostgreSQL, translator conformance) and the Python integration suites
# (real quipu + simulator processes, official openai/anthropic SDKs, Claude Code, Prometheus).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
started=$(date +%s)

step() { printf '\n=== %s (%ss)\n' "$1" "$(( $(date +%s) - started ))" >&2; }

step "dependencies"
source scripts/deps.sh

step "format"
cargo fmt --all -- --check

step "lint"
cargo clippy --release --workspace --all-targets -- -D warnings

step "build"
cargo build --release --workspace

step "postgresql"
pg_env="$(scripts/pg-test.sh start)"
eval "$pg_env"
trap 'scripts/pg-test.sh stop >/dev/null 2>&1 || true' EXIT

step "rust tests"
cargo test --release --workspace

step "integration tests"
"$root/.venv/bin/python" -m pytest -q -p no:cacheprovider tests/python "$@"

step "done"

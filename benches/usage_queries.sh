#!/usr/bin/env bash
# The account API's usage queries at 10^6 ledger rows, on SQLite and on PostgreSQL:
#
#   benches/usage_queries.sh [ROWS]        # default 1000000; ~10 minutes on two cores
#
# Builds examples/usage_queries.rs, fills a fresh SQLite file and a throwaway PostgreSQL
# (scripts/pg-test.sh) through the gateway's own write path, times every query and prints the
# tables that docs/benchmarks-usage.md records. Not part of the test suite (too long); the
# store suite checks the same queries' results and plans on small data.
set -euo pipefail
cd "$(dirname "$0")/.."
rows="${1:-1000000}"
target="${CARGO_TARGET_DIR:-target}"
cargo build --release --example usage_queries
bin="$target/release/examples/usage_queries"
tmp="$(mktemp -d)"
# pg-test.sh runs the server as the postgres user, which must reach its data directory.
chmod 755 "$tmp"
trap 'TMPDIR="$tmp" scripts/pg-test.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT

echo "## SQLite"
echo
"$bin" --store "sqlite://$tmp/usage.db" --rows "$rows"
echo
echo "## PostgreSQL"
echo
# An assignment, so that `set -e` stops here if PostgreSQL cannot start.
pg_env="$(TMPDIR="$tmp" scripts/pg-test.sh start)"
eval "$pg_env"
"$bin" --store "$QUIPU_TEST_PG_URL" --rows "$rows"

#!/usr/bin/env bash
# The multi-replica acceptance run at the issue's scale (tests/python/test_replicas.py with 60 s
# rate windows instead of the suite's 6 s): 3 quipu replicas on one PostgreSQL behind nginx.
#
#   ./scripts/replicas.sh                # about 12 minutes; prints every figure
#   ./scripts/replicas.sh -k rolling     # one part (pytest -k)
#
# - rate limits: a key with rpm 60 (and one with tpm 2000) driven at 5 times its limit for
#   2 whole 60-second windows through the balancer; shared windows against each replica
#   counting alone (the local engine, i.e. the gateway before shared windows), per window;
# - a S/ 1.00 tenant spending through the 3 replicas;
# - a rolling restart under 100 requests/s of mixed streaming SDK traffic;
# - a graceful binary upgrade under load.
#
# Builds what is missing (release), starts a throwaway PostgreSQL and stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export QUIPU_DEPS_BUILD_ONLY="${QUIPU_DEPS_BUILD_ONLY:-0}"
source scripts/deps.sh
cargo build --release --workspace
pg_env="$(scripts/pg-test.sh start)"
eval "$pg_env"
trap 'scripts/pg-test.sh stop >/dev/null 2>&1 || true' EXIT
export QUIPU_REPLICAS_WINDOW_S="${QUIPU_REPLICAS_WINDOW_S:-60}"
export QUIPU_REPLICAS_WINDOWS="${QUIPU_REPLICAS_WINDOWS:-2}"
export QUIPU_ROLLING_RATE="${QUIPU_ROLLING_RATE:-100}"
python="${QUIPU_PYTHON:-.venv/bin/python}"
"$python" -m pytest -q -s -p no:cacheprovider tests/python/test_replicas.py "$@"

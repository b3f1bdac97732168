#!/usr/bin/env bash
# The long soak: ./scripts/soak.sh [minutes]   (default 10). Builds, then runs tests/python/soak.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
cargo build --release --workspace
exec .venv/bin/python tests/python/soak.py --minutes "${1:-10}"

#!/usr/bin/env bash
# Installs the OpenAI Codex CLI into tests/.tools/codex for the offline integration test
# (tests/python/test_codex.py). Pinned: 0.169.0 is the version whose requests the translator's
# tests encode (crates/quipu-core/src/translate/responses/tests/codex.rs); a newer CLI may send
# other shapes, so move the pin and those tests together.
# The npm package fetches its native binary (codex-linux-x64) as an optional dependency.
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CODEX_VERSION:-0.169.0}"
dir="tests/.tools/codex"
if [ -x "$dir/node_modules/.bin/codex" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is required: apt-get install -y nodejs npm" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
echo '{"name":"quipu-codex-test","private":true}' > package.json
npm install --no-audit --no-fund --loglevel=error "@openai/codex@$version" >&2
echo "$version" > .version

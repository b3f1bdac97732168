#!/usr/bin/env bash
# Installs the official `openai` Node SDK (pinned) into tests/.tools/openai-node for the
# integration test that streams a Responses API request with it (tests/python/test_openai_node.py).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${OPENAI_NODE_VERSION:-7.57.0}"
dir="tests/.tools/openai-node"
if [ -f "$dir/node_modules/openai/package.json" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is required: apt-get install -y nodejs npm" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
echo '{"name":"quipu-openai-node-test","private":true}' > package.json
npm install --no-audit --no-fund --loglevel=error "openai@$version" >&2
echo "$version" > .version

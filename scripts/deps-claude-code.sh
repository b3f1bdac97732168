#!/usr/bin/env bash
# Installs the Claude Code CLI (pinned) into tests/.tools/claude-code for the offline
# integration test. The version is pinned because npm on Node 20 would otherwise pick an old
# release (newer ones declare engines.node >= 22; the CLI is a native binary and does not
# use the system node).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${CLAUDE_CODE_VERSION:-2.1.330}"
dir="tests/.tools/claude-code"
if [ -x "$dir/node_modules/.bin/claude" ] && [ "$(cat "$dir/.version" 2>/dev/null)" = "$version" ]; then
  exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "npm is required: apt-get install -y nodejs npm" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
echo '{"name":"quipu-claude-code-test","private":true}' > package.json
npm install --no-audit --no-fund --loglevel=error "@anthropic-ai/claude-code@$version" >&2
echo "$version" > .version

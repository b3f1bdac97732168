#!/usr/bin/env bash
# Installs what building and testing Quipu needs on a fresh Debian 12 machine, and nothing when
# it is already there. Sourced by scripts/test.sh and scripts/run.sh; safe to run on its own.
#
#   build:  cmake (pingora builds zlib-ng with it), a C compiler, curl (run.sh --demo)
#   tests:  PostgreSQL server binaries, Prometheus + promtool, Python 3 venv with the pinned
#           official SDKs (tests/python/requirements.txt), Node.js/npm for Claude Code,
#           Debian's Chromium and its WebDriver (the account page's browser test, with Selenium)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

need_apt=()
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
# curl: the catalog checks in docs/operating.md, and run.sh --demo (it waits and calls with it).
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ "${QUIPU_DEPS_BUILD_ONLY:-0}" != 1 ]; then
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
  command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
  # The balancer in front of several replicas (tests/python/test_replicas.py).
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need_apt+=(nginx)
  # Debian's python3 cannot make a venv without python3-venv (ensurepip).
  python3 -c 'import ensurepip' >/dev/null 2>&1 || need_apt+=(python3-venv)
  # The Claude Code and Codex integration tests install their CLIs with npm
  # (scripts/deps-claude-code.sh, scripts/deps-codex.sh), the Node SDK test its SDK
  # (scripts/deps-openai-node.sh).
  command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
  # tests/python/test_account_page.py drives the system's Chromium; nothing is downloaded.
  command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
fi

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "deps: installing ${need_apt[*]} (apt)" >&2
  if [ "$(id -u)" != 0 ]; then sudo=sudo; else sudo=; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq >/dev/null || true
  if ! $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null; then
    echo "deps: could not install ${need_apt[*]}; install them with apt-get and retry" >&2
    exit 1
  fi
  # Debian starts the packaged services; the tests run their own instances.
  if printf '%s\n' "${need_apt[@]}" | grep -qx prometheus; then
    $sudo systemctl stop prometheus prometheus-node-exporter >/dev/null 2>&1 || true
    $sudo pkill -u prometheus -x prometheus >/dev/null 2>&1 || true   # the packaged one only
  fi
  if printf '%s\n' "${need_apt[@]}" | grep -qx nginx; then
    $sudo systemctl stop nginx >/dev/null 2>&1 || true
    $sudo /usr/sbin/nginx -s stop >/dev/null 2>&1 || true   # the packaged one (its own pid file)
  fi
fi

if [ "${QUIPU_DEPS_BUILD_ONLY:-0}" != 1 ]; then
  venv="$here/.venv"
  req="$here/tests/python/requirements.txt"
  stamp="$venv/.requirements.sha"
  want="$(sha256sum "$req" | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "deps: creating the Python test environment (.venv)" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip >/dev/null
    "$venv/bin/pip" install -q -r "$req"
    echo "$want" > "$stamp"
  fi
fi

#!/usr/bin/env bash
# `./scripts/run.sh --demo`: Quipu with a simulated upstream and a tenant, in one command.
#
# Builds quipu and the simulator (quipu-sim), starts the simulator as the upstream of all three
# models and `quipu serve` on conf/demo.toml, creates the tenant `demo` with S/ 100.00 and a
# key (with the quipu CLI), prints the key and a curl for every endpoint, sends one chat
# request and prints its answer and its ledger row, then runs until Ctrl-C (or SIGTERM) and
# stops both processes. The store is a fresh SQLite file in a temporary directory, removed at
# the end.
#
# Ports (defaults): QUIPU_DEMO_PORT (8080, the API), QUIPU_DEMO_SIM_PORT (8000),
# QUIPU_DEMO_METRICS_PORT (9091). QUIPU_DEMO_DIR keeps the store and logs in that directory
# instead (not removed).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

port="${QUIPU_DEMO_PORT:-8080}"
sim_port="${QUIPU_DEMO_SIM_PORT:-8000}"
metrics_port="${QUIPU_DEMO_METRICS_PORT:-9091}"
base="http://127.0.0.1:$port"

dir=""
say() { printf '%s\n' "$*"; }
# Says what failed, with the end of the logs (they are removed on the way out).
fail() {
  printf 'demo: %s\n' "$*" >&2
  local log
  for log in "$dir/quipu.log" "$dir/sim.log"; do
    if [ -n "$dir" ] && [ -s "$log" ]; then
      printf -- '--- the last lines of %s:\n' "$(basename "$log")" >&2
      tail -n 15 "$log" >&2
    fi
  done
  exit 1
}
# Refuses a port that something already listens on (it would answer in our servers' place).
port_free() {
  if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
    fail "127.0.0.1:$1 is in use; pick another port with $2=PORT"
  fi
}
port_free "$port" QUIPU_DEMO_PORT
port_free "$sim_port" QUIPU_DEMO_SIM_PORT
port_free "$metrics_port" QUIPU_DEMO_METRICS_PORT

QUIPU_DEPS_BUILD_ONLY=1 source scripts/deps.sh
say "demo: building quipu and quipu-sim (release; minutes the first time)"
cargo build --release -p quipu -p quipu-sim
bin="${CARGO_TARGET_DIR:-$root/target}/release"

if [ -n "${QUIPU_DEMO_DIR:-}" ]; then
  dir="$QUIPU_DEMO_DIR"; keep=1
  mkdir -p "$dir"
  rm -f "$dir/demo.db" "$dir/demo.db-wal" "$dir/demo.db-shm"
else
  dir="$(mktemp -d "${TMPDIR:-/tmp}/quipu-demo.XXXXXX")"; keep=0
fi
config="$dir/demo.toml"
sed -e "s|127.0.0.1:8080|127.0.0.1:$port|" \
    -e "s|127.0.0.1:8000|127.0.0.1:$sim_port|" \
    -e "s|127.0.0.1:9091|127.0.0.1:$metrics_port|" \
    -e "s|sqlite://data/demo.db|sqlite://$dir/demo.db|" \
    -e "s|/tmp/quipu-demo|$dir/quipu|" \
    conf/demo.toml > "$config"
quipu() { "$bin/quipu" --config "$config" "$@"; }

sim_pid=""
quipu_pid=""
# Stops what was started (SIGTERM: quipu drains and flushes its ledger), then cleans up.
stop() {
  trap - INT TERM EXIT
  say ""
  say "demo: stopping"
  local code=0
  if [ -n "$quipu_pid" ] && kill -0 "$quipu_pid" 2>/dev/null; then
    kill -TERM "$quipu_pid" 2>/dev/null || true
    wait "$quipu_pid" || code=$?
  fi
  if [ -n "$sim_pid" ] && kill -0 "$sim_pid" 2>/dev/null; then
    kill -TERM "$sim_pid" 2>/dev/null || true
    wait "$sim_pid" 2>/dev/null || true
  fi
  local failed=0
  if [ "$code" != 0 ]; then (fail "quipu exited with status $code") || failed=1; fi
  if [ "$keep" = 0 ]; then rm -rf "$dir"; fi
  if [ "$failed" = 1 ]; then exit 1; fi
  say "demo: stopped"
  exit "${1:-0}"
}
trap 'stop 0' INT TERM
trap 'stop 1' EXIT

# Waits up to 30 s for `curl ARGS` to answer 200.
wait_200() {
  local what="$1"; shift
  for _ in $(seq 300); do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$@" || true)" = 200 ]; then return 0; fi
    sleep 0.1
  done
  fail "$what did not answer in 30 s"
}

"$bin/quipu" --config "$config" serve --check >/dev/null
# Each in a session of its own, so that a Ctrl-C reaches only this script, which stops them
# in order (quipu first, with SIGTERM: it drains and flushes its ledger).
setsid "$bin/quipu-sim" --listen "127.0.0.1:$sim_port" >"$dir/sim.log" 2>&1 &
sim_pid=$!
wait_200 "the simulator (127.0.0.1:$sim_port)" "http://127.0.0.1:$sim_port/health"
QUIPU_LOG="${QUIPU_LOG:-info}" setsid "$bin/quipu" --config "$config" serve >"$dir/quipu.log" 2>&1 &
quipu_pid=$!
wait_200 "quipu ($base)" "$base/health"

quipu tenant create demo >/dev/null
quipu topup --tenant demo --amount 100.00 --note "demo" >/dev/null
key="$(quipu key create --tenant demo --label demo --json | sed -n 's/.*"secret": *"\([^"]*\)".*/\1/p')"
[ -n "$key" ] || fail "could not create a key for tenant demo"

chat='{"model":"colibri","messages":[{"role":"user","content":"Hola, ¿quién eres?"}],"max_tokens":64}'
stream='{"model":"colibri","messages":[{"role":"user","content":"Cuenta hasta cinco"}],"max_tokens":64,"stream":true}'
messages='{"model":"aguila","max_tokens":64,"messages":[{"role":"user","content":"Hola"}]}'
count='{"model":"apu","messages":[{"role":"user","content":"¿Cuántos tokens tiene esto?"}]}'
bearer="Authorization: Bearer $key"
anthropic="x-api-key: $key"
ct="content-type: application/json"

# The key reaches the running gateway within store.key_refresh_ms; until then it gets a 401.
# (An empty body: the gateway refuses it before anything is billed.)
for _ in $(seq 100); do
  code="$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/chat/completions" \
    -H "$bearer" -H "$ct" -d '{}' || true)"
  if [ "$code" != 401 ] && [ "$code" != 000 ]; then break; fi
  sleep 0.1
done

say ""
say "Quipu is running at $base with a simulated upstream (quipu-sim on 127.0.0.1:$sim_port)."
say "Tenant demo has S/ 100.00 and this API key:"
say ""
say "    $key"
say ""
say "Try it (each line is a complete command):"
say ""
say "curl -s $base/v1/models"
say "curl -s $base/v1/pricing"
say "curl -s $base/v1/plans"
say "curl -s $base/v1/chat/completions -H '$bearer' -H '$ct' -d '$chat'"
say "curl -sN $base/v1/chat/completions -H '$bearer' -H '$ct' -d '$stream'"
say "curl -s $base/v1/messages -H '$anthropic' -H 'anthropic-version: 2023-06-01' -H '$ct' -d '$messages'"
say "curl -s $base/v1/messages/count_tokens -H '$anthropic' -H 'anthropic-version: 2023-06-01' -H '$ct' -d '$count'"
say ""

say "One chat request, sent now:"
say ""
say "  > Hola, ¿quién eres?"
answer="$(curl -s "$base/v1/chat/completions" -H "$bearer" -H "$ct" -d "$chat")"
content="$(printf '%s' "$answer" | sed -n 's/.*"content":"\([^"]*\)".*/\1/p')"
say "  < ${content:-$answer}"
say ""

# The gateway writes ledger rows in batches (store.ledger_flush_ms); wait for this one.
for _ in $(seq 100); do
  if quipu statement --tenant demo --json | grep -q '"requests": [1-9]'; then break; fi
  sleep 0.1
done
say "Its ledger row, as the operator sees it (quipu statement --tenant demo):"
say ""
quipu statement --tenant demo | sed 's/^/  /'
say ""
say "Logs: $dir/quipu.log and $dir/sim.log. Metrics: http://127.0.0.1:$metrics_port/metrics"
say "demo ready: $base (Ctrl-C stops quipu and the simulator)"

# Until Ctrl-C; a gateway that stops by itself ends the demo with its log.
set +e
wait "$quipu_pid"
code=$?
quipu_pid=""
fail "quipu stopped unexpectedly (status $code)"

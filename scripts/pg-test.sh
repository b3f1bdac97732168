#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for Quipu's store tests and prints the URL to use.
#
#   eval "$(scripts/pg-test.sh start)"   # starts a server, exports QUIPU_TEST_PG_URL
#   cargo test --release --test store_suite
#   scripts/pg-test.sh stop              # stops it and deletes its files
#
#   scripts/pg-test.sh run -- cargo test --release --test store_suite   # the three in one
#
#   scripts/pg-test.sh pause [DIR]    # stops the server, keeps its files (a database that is down)
#   scripts/pg-test.sh resume [DIR]   # starts it again on the same port
#
# The server lives in a fresh temporary directory (data, log and its unix socket), listens on a
# free port of 127.0.0.1 only, trusts local connections (no password: it holds nothing but test
# data) and runs with fsync off (speed; durability is not what these tests check). As root it
# runs as the `postgres` user if there is one, else as a `quipu-pg` system user it creates:
# PostgreSQL refuses to run as root. Binaries come from $PG_BIN, else the newest
# /usr/lib/postgresql/*/bin, else pg_config/PATH.
set -euo pipefail

# One state file per checkout, so two checkouts' test runs never stop each other's server.
checkout="$(cd "$(dirname "$0")/.." && pwd)"
state_file="${TMPDIR:-/tmp}/quipu-pg-test.$(printf '%s' "$checkout" | cksum | cut -d' ' -f1).current"

die() { echo "pg-test.sh: $*" >&2; exit 1; }

find_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$d" ] && [ -x "$d/initdb" ]; then echo "$d"; return; fi
  if command -v pg_config >/dev/null 2>&1; then pg_config --bindir; return; fi
  d=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  [ -x "$d/initdb" ] || die "no PostgreSQL binaries found (install postgresql, or set PG_BIN to the directory holding initdb and pg_ctl)"
  echo "$d"
}

# The user the server runs as, and a prefix that runs a command as that user.
pick_user() {
  if [ "$(id -u)" -ne 0 ]; then
    run_as=(); pg_user=$(id -un); return
  fi
  if id postgres >/dev/null 2>&1; then
    pg_user=postgres
  else
    pg_user=quipu-pg
    id "$pg_user" >/dev/null 2>&1 ||
      useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user" ||
      die "cannot create the $pg_user system user to run PostgreSQL as (it refuses to run as root)"
  fi
  command -v runuser >/dev/null 2>&1 || die "runuser is needed to start PostgreSQL as $pg_user"
  run_as=(runuser -u "$pg_user" --)
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pg_start() {
  local bin=$1 dir=$2 port=$3
  "${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300" \
    start >/dev/null 2>&1
}

start() {
  local bin dir port tries=0
  bin=$(find_bin)
  pick_user
  dir=$(mktemp -d "${TMPDIR:-/tmp}/quipu-pg.XXXXXX")
  chmod 700 "$dir"
  [ "$(id -u)" -ne 0 ] || chown "$pg_user" "$dir"
  "${run_as[@]}" "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-locale \
    --no-sync >"$dir/initdb.log" 2>&1 || die "initdb failed; see $dir/initdb.log"
  port=$(( 20000 + RANDOM % 20000 ))
  while :; do
    tries=$((tries + 1))
    [ "$tries" -le 20 ] || die "could not start PostgreSQL on a free port; see $dir/server.log"
    if port_free "$port" && pg_start "$bin" "$dir" "$port"; then
      break
    fi
    port=$(( 20000 + RANDOM % 20000 ))
  done
  echo "$port" >"$dir/port"
  printf '%s\n%s\n%s\n' "$dir" "$bin" "$pg_user" >"$state_file"
  echo "pg-test.sh: PostgreSQL running in $dir on 127.0.0.1:$port; stop it with: scripts/pg-test.sh stop" >&2
  echo "export QUIPU_TEST_PG_URL='postgres://postgres@127.0.0.1:$port/postgres'"
  echo "export QUIPU_TEST_PG_DIR='$dir'"
}

stop() {
  local dir="${1:-${QUIPU_TEST_PG_DIR:-}}" bin pg_user_saved
  if [ -z "$dir" ] && [ -f "$state_file" ]; then dir=$(sed -n 1p "$state_file"); fi
  [ -n "$dir" ] || die "nothing to stop (no QUIPU_TEST_PG_DIR and no $state_file)"
  [ -d "$dir/data" ] || die "$dir holds no test server"
  bin=$(find_bin)
  pick_user
  if [ -f "$state_file" ] && [ "$(sed -n 1p "$state_file")" = "$dir" ]; then
    pg_user_saved=$(sed -n 3p "$state_file")
    [ "$(id -u)" -ne 0 ] || run_as=(runuser -u "$pg_user_saved" --)
    rm -f "$state_file"
  fi
  "${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
  echo "pg-test.sh: stopped and removed $dir" >&2
}

# The directory of a running (or paused) test server: $1, $QUIPU_TEST_PG_DIR or the last started.
server_dir() {
  local dir="${1:-${QUIPU_TEST_PG_DIR:-}}"
  if [ -z "$dir" ] && [ -f "$state_file" ]; then dir=$(sed -n 1p "$state_file"); fi
  [ -n "$dir" ] && [ -d "$dir/data" ] || die "no test server (pass its directory or set QUIPU_TEST_PG_DIR)"
  echo "$dir"
}

pause() {
  local dir bin
  dir=$(server_dir "${1:-}")
  bin=$(find_bin)
  pick_user
  "${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 ||
    die "could not stop the server in $dir; see $dir/server.log"
}

resume() {
  local dir bin
  dir=$(server_dir "${1:-}")
  [ -f "$dir/port" ] || die "$dir/port is missing: was this server started by pg-test.sh start?"
  bin=$(find_bin)
  pick_user
  pg_start "$bin" "$dir" "$(cat "$dir/port")" ||
    die "could not start the server in $dir again; see $dir/server.log"
}

case "${1:-start}" in
  start) start ;;
  stop) shift || true; stop "${1:-}" ;;
  pause) shift || true; pause "${1:-}" ;;
  resume) shift || true; resume "${1:-}" ;;
  run)
    shift
    [ "${1:-}" = "--" ] && shift
    [ "$#" -gt 0 ] || die "usage: scripts/pg-test.sh run -- COMMAND [ARGS…]"
    eval "$(start)"
    trap 'stop "$QUIPU_TEST_PG_DIR"' EXIT
    set +e
    "$@"
    status=$?
    set -e
    exit "$status"
    ;;
  *) die "usage: scripts/pg-test.sh [start | stop [DIR] | pause [DIR] | resume [DIR] | run -- COMMAND…]" ;;
esac

#!/usr/bin/env bash
# Starts (or stops) a throw-away PostgreSQL 15 cluster for tests and benchmarks.
# PostgreSQL refuses to run as root, and CI runs as root: the cluster then runs as the
# `postgres` OS user, with its data in a directory that user owns. Trust auth on loopback only.
#   scripts/postgres.sh start   -> prints the URL to use (also written to .pg/url)
#   scripts/postgres.sh stop
set -euo pipefail
cd "$(dirname "$0")/.."
PORT="${DUPGUARD_TEST_PG_PORT:-55432}"
DATA="${DUPGUARD_TEST_PG_DATA:-/tmp/dupguard-pg-$PORT}"
mkdir -p .pg

find_bin() {
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
  done
  return 1
}

BIN=$(find_bin || true)
if [ -z "$BIN" ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "postgres.sh: installing postgresql-15 from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15) >&2
    BIN=$(find_bin)
  else
    echo "postgres.sh: no PostgreSQL server binaries found; install postgresql-15" >&2
    exit 1
  fi
fi

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "${1:-start}" in
  start)
    if ! as_pg "$BIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
      if [ ! -f "$DATA/PG_VERSION" ]; then
        rm -rf "$DATA"; mkdir -p "$DATA"
        [ "$(id -u)" = 0 ] && chown postgres "$DATA"
        as_pg "$BIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
        cat >>"$DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PORT
unix_socket_directories = '$DATA'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 200
shared_buffers = 256MB
track_io_timing = on
CONF
      fi
      as_pg "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w -t 60 start >/dev/null
    fi
    URL="postgresql://postgres@127.0.0.1:$PORT/postgres"
    echo "$URL" > ".pg/url-$PORT"
    echo "$URL"
    ;;
  stop)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast stop >/dev/null 2>&1 || true
    ;;
  restart)
    as_pg "$BIN/pg_ctl" -D "$DATA" -m fast -w restart -l "$DATA/server.log" >/dev/null
    ;;
  *) echo "usage: $0 start|stop|restart" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Prints the path of Debian's redis-server (the Celery broker of the end-to-end harness, tests/e2e),
# installing the package first when it is missing, as scripts/postgres.sh does for PostgreSQL.
# The harness runs its own redis-server per run (free port, no persistence, stopped with the run);
# the system service is never used, and stopped if the package's postinst started it.
set -euo pipefail
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "redis.sh: installing redis-server from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >&2
    if command -v service >/dev/null 2>&1; then service redis-server stop >/dev/null 2>&1 || true; fi
  else
    echo "redis.sh: redis-server not found; install the Debian package redis-server" >&2
    exit 1
  fi
fi
command -v redis-server

#!/usr/bin/env bash
# Prints the path of Debian's faketime (libfaketime), installing the package first when it is missing,
# as scripts/redis.sh does for redis-server. tests/integration/test_clock_skew.py runs dupguard under it
# with the host clock 10 minutes off the database's (dupguard must judge ages on the database's clock).
set -euo pipefail
if ! command -v faketime >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "faketime.sh: installing faketime from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime) >&2
  else
    echo "faketime.sh: faketime not found; install the Debian package faketime" >&2
    exit 1
  fi
fi
command -v faketime

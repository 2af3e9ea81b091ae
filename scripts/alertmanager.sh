#!/usr/bin/env bash
# Makes sure Debian's prometheus-alertmanager (and its amtool) is installed: the Alertmanager sink's
# tests (tests/integration/test_alertmanager.py) start their own alertmanager on a free port and make
# silences with amtool. As root on a fresh machine this installs the package (like scripts/promtool.sh);
# otherwise it says what to install. The packaged service is never used: RUNLEVEL=1 keeps invoke-rc.d
# from starting it, and it is stopped if the postinst started it anyway.
set -euo pipefail
if [ -x /usr/bin/prometheus-alertmanager ] && [ -x /usr/bin/amtool ]; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  echo "alertmanager.sh: installing Debian's prometheus-alertmanager package" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends prometheus-alertmanager) >&2
  if command -v service >/dev/null 2>&1; then service prometheus-alertmanager stop >/dev/null 2>&1 || true; fi
  [ -x /usr/bin/prometheus-alertmanager ] && [ -x /usr/bin/amtool ] || {
    echo "alertmanager.sh: prometheus-alertmanager or amtool still missing after the install" >&2
    exit 1
  }
else
  echo "alertmanager.sh: prometheus-alertmanager not found; install Debian's prometheus-alertmanager package" >&2
  exit 1
fi

#!/usr/bin/env bash
# Makes sure promtool (Prometheus' rule checker) is installed: the deploy tests run
# `promtool check rules` and `promtool test rules` on the alert rules. It comes from Debian's
# `prometheus` package; as root on a fresh machine this installs it (like scripts/postgres.sh does
# for PostgreSQL), otherwise it says what to install. The package's service is not started.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ]; then
  echo "promtool.sh: installing Debian's prometheus package for promtool" >&2
  # RUNLEVEL=1 keeps invoke-rc.d from starting the packaged Prometheus server (only promtool is used).
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends prometheus) >&2
  command -v promtool >/dev/null 2>&1 || { echo "promtool.sh: promtool still missing after the install" >&2; exit 1; }
else
  echo "promtool.sh: promtool not found; install Debian's prometheus package (apt-get install prometheus)" >&2
  exit 1
fi

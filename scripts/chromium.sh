#!/usr/bin/env bash
# Prints the path of Debian's chromium (the headless browser of the UI plugin's tests,
# tests/integration/test_ui_plugin_browser.py), installing the package first when it is missing, as
# scripts/redis.sh does for redis-server. Playwright drives it (executable_path): no browser download.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "chromium.sh: installing chromium from Debian" >&2
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2
  else
    echo "chromium.sh: chromium not found; install the Debian package chromium" >&2
    exit 1
  fi
fi
command -v chromium

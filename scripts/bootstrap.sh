#!/usr/bin/env bash
# Creates .venv with dupguard and its test tools. Idempotent; used by `make test` and `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! command -v uv >/dev/null 2>&1; then
  "$PY" -m pip install -q uv >&2 || true
fi
if [ ! -x .venv/bin/python ]; then
  if command -v uv >/dev/null 2>&1; then uv venv -q --python "$PY" .venv; else "$PY" -m venv .venv; fi
fi
EXTRAS="${1:-test}"
if command -v uv >/dev/null 2>&1; then
  VIRTUAL_ENV=$PWD/.venv uv pip install -q -e ".[$EXTRAS]"
else
  .venv/bin/pip install -q -e ".[$EXTRAS]"
fi

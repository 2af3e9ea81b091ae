#!/usr/bin/env bash
# Creates .venv with dupguard and its test tools (argument "": the package alone, for `make demo`).
# Idempotent; used by `make test` and `make demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if ! command -v uv >/dev/null 2>&1; then
  "$PY" -m pip install -q uv >&2 || true
fi
if [ ! -x .venv/bin/python ]; then
  if command -v uv >/dev/null 2>&1; then uv venv -q --python "$PY" .venv; else "$PY" -m venv .venv; fi
fi
EXTRAS="${1-test}"  # "" (make demo): the package alone, without the test tools
SPEC="."
if [ -n "$EXTRAS" ]; then SPEC=".[$EXTRAS]"; fi
if command -v uv >/dev/null 2>&1; then
  VIRTUAL_ENV=$PWD/.venv uv pip install -q -e "$SPEC"
else
  .venv/bin/pip install -q -e "$SPEC"
fi

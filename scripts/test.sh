#!/usr/bin/env bash
# The whole test suite on a fresh machine: venv, PostgreSQL, lint, types, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
export DUPGUARD_TEST_DATABASE_URL="$(scripts/postgres.sh start)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
.venv/bin/pytest "$@"

#!/usr/bin/env bash
# The whole test suite on a fresh machine: venv, PostgreSQL, lint, types, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
export DUPGUARD_TEST_DATABASE_URL="$(scripts/postgres.sh start)"
scripts/promtool.sh  # promtool for the alert-rule checks in tests/deploy
scripts/redis.sh >/dev/null  # Debian's redis-server: the Celery broker of the end-to-end test (tests/e2e)
scripts/faketime.sh >/dev/null  # Debian's faketime: dupguard on a skewed host clock (test_clock_skew.py)
scripts/chromium.sh >/dev/null  # Debian's chromium: the UI plugin's pages in a headless browser (test_ui_plugin.py)
scripts/alertmanager.sh  # Debian's prometheus-alertmanager and amtool: the Alertmanager sink's tests (tests/alertmanager.py)
# Real Airflow for the remediation (API server), guard (scheduler code) and end-to-end tests.
for version in 3.0.6 3.1.2 3.2.2 3.3.2; do
  scripts/airflow/venv.sh "$version" >&2
done
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# Four workers (pytest-xdist; most tests wait on servers and sleeps, so more workers than cores pay),
# one module per worker at a time (tests/conftest.py: module fixtures start once, named groups share a
# session fixture). DUPGUARD_TEST_WORKERS=0 runs the suite serially in this process.
# The slowest tests in the log: where the time goes, for the next one who makes CI faster.
.venv/bin/pytest -n "${DUPGUARD_TEST_WORKERS:-4}" --dist loadfile --durations=50 "$@"

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
# Serial by default: on CI's two cores, four pytest-xdist workers (DUPGUARD_TEST_WORKERS=4; one module per
# worker at a time, tests/conftest.py) took 31-37 minutes instead of about 46, but starved the timing-bound
# tests (the fencing trials' 2 s API calls, the alert digests' 5 s window) often enough to fail a run
# (benchmarks/results/ci-20261207-*.txt). Use workers on a machine with cores to spare.
# The slowest tests in the log: where the time goes, for the next one who makes CI faster.
.venv/bin/pytest -n "${DUPGUARD_TEST_WORKERS:-0}" --dist loadfile --durations=50 "$@"

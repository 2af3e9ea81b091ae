#!/usr/bin/env bash
# The whole test suite on a fresh machine: venv, PostgreSQL, lint, types, tests.
# Extra arguments go to pytest (e.g. scripts/test.sh -k scan).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
export DUPGUARD_TEST_DATABASE_URL="$(scripts/postgres.sh start)"
# On CI the test server goes with the machine: no test session drops the hundreds of databases it made.
[ -n "${CI:-}" ] && export DUPGUARD_TEST_DISPOSABLE_SERVER=1
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
# Two parts. First everything but the timing-bound modules on pytest-xdist workers (one module per worker at a
# time, longest first: tests/conftest.py); on CI's two cores most of a test's time is waiting for Airflow,
# PostgreSQL or a peer, so four workers keep both cores busy. Then the ``timing`` modules (a lease, a call
# timeout, a shutdown deadline, a digest window) one at a time, with no other test taking their CPU: beside
# other workers they missed those bounds for want of a CPU (benchmarks/results/ci-20261207-*.txt).
# DUPGUARD_TEST_WORKERS=0 runs everything serially in one part. The slowest tests go to the log: where the
# time goes, for the next one who makes CI faster.
workers="${DUPGUARD_TEST_WORKERS:-4}"
if [ "$workers" = 0 ]; then
  exec .venv/bin/pytest --durations=50 "$@"
fi
status=0
.venv/bin/pytest -n "$workers" --dist loadfile -m "not timing" --durations=40 "$@" || status=$?
timing=0
.venv/bin/pytest -m timing --durations=10 "$@" || timing=$?
# 5 = no test collected: a selection (-k, a path) may leave one part empty.
[ "$status" = 5 ] && [ "$timing" != 5 ] && status=0
[ "$timing" = 5 ] && [ "$status" != 5 ] && timing=0
[ "$status" != 0 ] && exit "$status"
exit "$timing"

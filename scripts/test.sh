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
# Two parts at once. Everything but the timing-bound modules runs on pytest-xdist workers (one module per worker
# at a time, longest first: tests/conftest.py); on CI's two cores most of a test's time is waiting for Airflow,
# PostgreSQL or a peer, so four workers keep both cores busy. Beside them, the ``timing`` modules (a lease, a
# call timeout, a shutdown deadline, a digest window) run one at a time in a session of their own, and the
# workers run at nice 10: whenever a timing test wants a CPU it gets one. As equals beside busy workers those
# tests missed their bounds for want of a CPU; alone after the rest they used a third of one core for seven
# minutes (benchmarks/results/timing-part-20261207-de50b26.txt, ci-20261207-*.txt). The niced workers' own
# liveness bounds (a daemon leading, an alert arriving) are three times as patient (DUPGUARD_TEST_PATIENCE,
# tests/daemon_harness.py): the timing session takes their CPU in bursts. Its output follows the workers'.
# DUPGUARD_TEST_WORKERS=0 runs everything serially in one part. The slowest tests go to the log: where the
# time goes, for the next one who makes CI faster.
workers="${DUPGUARD_TEST_WORKERS:-4}"
if [ "$workers" = 0 ]; then
  exec .venv/bin/pytest --durations=50 "$@"
fi
timing_log="$(mktemp -t dupguard-timing.XXXXXX)"
trap 'rm -f "$timing_log"' EXIT
timing=0
.venv/bin/pytest -p no:cacheprovider -m timing --durations=10 "$@" >"$timing_log" 2>&1 &
timing_pid=$!
status=0
DUPGUARD_TEST_PATIENCE=3 nice -n 10 .venv/bin/pytest -n "$workers" --dist loadfile -m "not timing" --durations=40 "$@" ||
  status=$?
wait "$timing_pid" || timing=$?
cat "$timing_log"
# 5 = no test collected: a selection (-k, a path) may leave one part empty.
[ "$status" = 5 ] && [ "$timing" != 5 ] && status=0
[ "$timing" = 5 ] && [ "$status" != 5 ] && timing=0
[ "$status" != 0 ] && exit "$status"
exit "$timing"

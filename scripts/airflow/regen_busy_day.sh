#!/usr/bin/env bash
# Regenerates tests/fixtures/scenarios/<ver>/busy/busy_day.{sql,json}: a compressed day of a busy HA
# deployment with a few planted members of every kind dupguard finds, made by Airflow's own code (see
# scripts/airflow/scenarios_busy_day.py). Same pipeline as regen_scenarios.sh (fresh DB, migrate,
# generate, data-only dump, load check), in a sub-folder so the per-scenario suites that iterate over
# <ver>/*.json do not load this larger fixture, with the log (pauses) and deadline (3.1: the callback
# trigger's link) tables kept and a 3 MB limit.
#
#   scripts/airflow/regen_busy_day.sh [VERSION...]   (default: 3.1.2 3.3.2)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ $# -gt 0 ] || set -- 3.1.2 3.3.2
SCENARIO_SUBDIR=busy SCENARIO_MAX_BYTES=$((3 * 1024 * 1024)) SCENARIO_KEEP_DATA="log deadline" \
  SCENARIO_GENERATOR=scripts/airflow/scenarios_busy_day.py exec scripts/airflow/regen_scenarios.sh "$@" -- busy_day

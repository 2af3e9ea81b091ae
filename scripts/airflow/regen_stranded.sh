#!/usr/bin/env bash
# Regenerates the stranded-event fixtures tests/fixtures/scenarios/<ver>/stranded_*.{sql,json}
# (apache/airflow#56050, open in every version we support) with Airflow's own code: see
# scripts/airflow/scenarios_stranded.py. Same pipeline as regen_scenarios.sh (fresh DB per
# scenario, migrate, generate, data-only dump, load check).
#
#   scripts/airflow/regen_stranded.sh [VERSION...] [-- SCENARIO...]   (default: all four, all)
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSIONS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VERSIONS+=("$1"); shift; done
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.0.6 3.1.2 3.2.2 3.3.2)
[ $# -gt 0 ] || set -- -- stranded_race stranded_max_active stranded_paused stranded_alias \
  stranded_catchup_floor stranded_and_waiting stranded_cleared stranded_late_commit stranded_late_next_window \
  stranded_late_own_row stranded_paused_run
# The log table's rows are kept: the check reads pauses and unpauses there.
SCENARIO_KEEP_DATA=log SCENARIO_GENERATOR=scripts/airflow/scenarios_stranded.py exec scripts/airflow/regen_scenarios.sh "${VERSIONS[@]}" "$@"

#!/usr/bin/env bash
# Regenerates the double-bump fixtures tests/fixtures/scenarios/<ver>/{double_bump,bump_*}.{sql,json}
# (apache/airflow#57618: schedule_tis bumps try_number with no state guard in 3.0.x/3.1.x, fixed in
# 3.2.0 by PR #60330) with Airflow's own code: see scripts/airflow/scenarios_double_bump.py. Same
# pipeline as regen_scenarios.sh (fresh DB per scenario, migrate, generate, data-only dump, load check).
#
#   scripts/airflow/regen_double_bump.sh [VERSION...] [-- SCENARIO...]
#   (default: 3.1.2 3.0.6 (affected) and 3.2.2 (fixed), every scenario)
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSIONS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VERSIONS+=("$1"); shift; done
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.1.2 3.0.6 3.2.2)
[ $# -gt 0 ] || set -- -- double_bump bump_retry bump_cleared bump_orphan_reset bump_after_stop
SCENARIO_GENERATOR=scripts/airflow/scenarios_double_bump.py exec scripts/airflow/regen_scenarios.sh "${VERSIONS[@]}" "$@"

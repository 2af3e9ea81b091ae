#!/usr/bin/env bash
# Regenerates tests/fixtures/scenarios/<ver>/trigger_event_*.{sql,json}: one message submitted by
# each triggerer's copy of an asset trigger (the consequence of trigger_flapping), made
# with Airflow's own code: see scripts/airflow/scenarios_trigger_event.py. Same pipeline as
# regen_scenarios.sh (fresh DB per scenario, migrate, generate, data-only dump, load check).
#
#   scripts/airflow/regen_trigger_event.sh [VERSION...] [-- SCENARIO...]
#   (default: 3.1.2 with every scenario; 3.0.6 with the two-run, id-less, absorbed, custom-id and
#   file-watcher ones; the fixed 3.2.2 with the two-run, id-less, absorbed and custom-id ones; 3.3.2 with
#   the absorbed and custom-id ones)
set -euo pipefail
cd "$(dirname "$0")/../.."
gen() { SCENARIO_GENERATOR=scripts/airflow/scenarios_trigger_event.py scripts/airflow/regen_scenarios.sh "$@"; }
if [ $# -gt 0 ]; then gen "$@"; exit; fi
gen 3.1.2 -- trigger_event_two_runs trigger_event_one_run trigger_event_distinct_ids trigger_event_no_id \
  trigger_event_manual trigger_event_file_alike trigger_event_no_id_one_triggerer trigger_event_no_id_absorbed \
  trigger_event_custom_id
gen 3.0.6 -- trigger_event_two_runs trigger_event_no_id trigger_event_file_alike trigger_event_no_id_absorbed \
  trigger_event_custom_id
gen 3.2.2 -- trigger_event_two_runs trigger_event_no_id trigger_event_no_id_absorbed trigger_event_custom_id
gen 3.3.2 -- trigger_event_no_id_absorbed trigger_event_custom_id

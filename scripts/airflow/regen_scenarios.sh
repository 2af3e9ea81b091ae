#!/usr/bin/env bash
# Regenerates tests/fixtures/scenarios/<ver>/<scenario>.{sql,json}: databases in which Airflow's own
# code created real duplicate asset-triggered runs (two racing schedulers) and look-alikes that must
# not be flagged. See scripts/airflow/scenarios_asset.py for what each scenario does and why.
#
#   scripts/airflow/regen_scenarios.sh [VERSION...] [-- SCENARIO...]   (default: 3.1.2 3.0.6, all)
#
# Per scenario: fresh DB `af_scn_<ver>_<scenario>` -> `airflow db migrate` -> generator (writes the
# .json ground truth) -> data-only pg_dump (no alembic_version, which the schema fixture holds) ->
# check that it loads into a DB freshly loaded from tests/fixtures/schema/airflow-<ver>.sql.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Another generator on the same shims (regen_stranded.sh sets scenarios_stranded.py).
GENERATOR="${SCENARIO_GENERATOR:-scripts/airflow/scenarios_asset.py}"
VERSIONS=()
SCENARIOS=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; SCENARIOS=("$@"); break; fi
  VERSIONS+=("$1"); shift
done
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.1.2 3.0.6)
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(race_asset race_asset_fanout fanout successive
  manual_scheduled_backfill and_premature cleared race_or_disjoint race_overlap)

export PGOPTIONS="-c client_min_messages=warning"
BASE_URL=$(scripts/postgres.sh start)
SERVER="${BASE_URL%/*}"
MAX_BYTES=${SCENARIO_MAX_BYTES:-$((300 * 1024))}
# Tables whose rows no dag_run/task_instance row needs and that only add noise or size.
EXCLUDE_DATA=(alembic_version log import_error callback_request dag_priority_parsing_request
  dag_warning deadline)
# A generator whose ground truth needs one of them sets SCENARIO_KEEP_DATA (regen_stranded.sh: log, the
# pause/unpause records).
KEEP_DATA=" ${SCENARIO_KEEP_DATA:-} "

for ver in "${VERSIONS[@]}"; do
  scripts/airflow/venv.sh "$ver" >/dev/null
  schema="tests/fixtures/schema/airflow-$ver.sql"
  [ -f "$schema" ] || scripts/airflow/regen_schema_fixtures.sh "$ver"
  out="tests/fixtures/scenarios/$ver${SCENARIO_SUBDIR:+/$SCENARIO_SUBDIR}"  # a sub-folder: regen_busy_day.sh
  mkdir -p "$out"
  for sc in "${SCENARIOS[@]}"; do
    t0=$(date +%s)
    db="af_scn_${ver//./_}_$sc"
    psql "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    home="/tmp/dupguard-airflow-home/$ver-$sc"   # stable path: it ends up in dag.fileloc
    rm -rf "$home"; mkdir -p "$home"
    log="/tmp/dupguard-scenario-$ver-$sc.log"
    AIRFLOW_HOME="$home" scripts/airflow/af.sh "$ver" "$SERVER/$db" airflow db migrate >"$log" 2>&1 \
      || { cat "$log" >&2; exit 1; }
    AIRFLOW_HOME="$home" scripts/airflow/af.sh "$ver" "$SERVER/$db" \
      python "$GENERATOR" --scenario "$sc" --out-json "$out/$sc.json" >>"$log" 2>&1 \
      || { cat "$log" >&2; exit 1; }
    excl=()
    for t in "${EXCLUDE_DATA[@]}"; do
      if [[ "$KEEP_DATA" != *" $t "* ]]; then excl+=("--exclude-table-data=public.$t"); fi
    done
    {
      echo "-- Airflow $ver scenario '$sc' (data only), made by scripts/airflow/regen_scenarios.sh."
      echo "-- Load after tests/fixtures/schema/airflow-$ver.sql. Ground truth: $sc.json"
      pg_dump --data-only --inserts --column-inserts --disable-triggers --no-owner "${excl[@]}" "$SERVER/$db" \
        | grep -v -E '^(SET transaction_timeout|SELECT pg_catalog.set_config\(.search_path)' \
        | grep -v -E '^\\(restrict|unrestrict) '
    } >"$out/$sc.sql.tmp"
    mv "$out/$sc.sql.tmp" "$out/$sc.sql"
    size=$(wc -c <"$out/$sc.sql")
    [ "$size" -lt "$MAX_BYTES" ] || { echo "$out/$sc.sql is $size bytes (> $MAX_BYTES)" >&2; exit 1; }
    # Check: schema fixture + this file load with ON_ERROR_STOP, and every run of the ground truth is there.
    chk="af_chk_${ver//./_}_$sc"  # per scenario: regen runs of other generators may run at once
    psql "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $chk WITH (FORCE)" -c "CREATE DATABASE $chk"
    psql "$SERVER/$chk" -qX -v ON_ERROR_STOP=1 -f "$schema" >/dev/null
    psql "$SERVER/$chk" -qX -v ON_ERROR_STOP=1 -f "$out/$sc.sql" >/dev/null
    want=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["all_run_ids"]))' "$out/$sc.json")
    runs=$(psql "$SERVER/$chk" -qXAt -c "SELECT count(*) FROM dag_run")
    [ "$want" = "$runs" ] || { echo "$sc: $runs dag_run rows loaded, ground truth lists $want" >&2; exit 1; }
    # Cross-check (not the ground truth): pairs of asset runs of one DAG with the same run_after or a
    # shared consumed event = expected groups of kind asset (every scenario's group is a pair; a
    # trigger_event group's runs share neither, by definition).
    want=$(python3 -c 'import json,sys; print(sum(g["kind"] == "asset" for g in json.load(open(sys.argv[1]))["expected_groups"]))' "$out/$sc.json")
    got=$(psql "$SERVER/$chk" -qXAt -c "SELECT count(*) FROM dag_run a JOIN dag_run b
      ON b.dag_id = a.dag_id AND b.id > a.id AND b.run_type = 'asset_triggered'
      WHERE a.run_type = 'asset_triggered' AND (a.run_after = b.run_after OR EXISTS (
        SELECT 1 FROM dagrun_asset_event x JOIN dagrun_asset_event y ON y.event_id = x.event_id
        WHERE x.dag_run_id = a.id AND y.dag_run_id = b.id))")
    [ "$want" = "$got" ] || { echo "$sc: $got linked run pairs in the DB, ground truth has $want" >&2; exit 1; }
    psql "$BASE_URL" -qX -c "DROP DATABASE $chk" >/dev/null
    echo "$out/$sc: $runs runs, $got duplicate groups, $size bytes, $(( $(date +%s) - t0 ))s"
  done
done

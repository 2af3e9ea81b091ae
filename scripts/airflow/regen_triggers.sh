#!/usr/bin/env bash
# Regenerates tests/fixtures/scenarios/<ver>/triggers/<scenario>.{json,<n>.sql}: trigger ownership
# after each triggerer loop, made by Airflow's own code (see scripts/airflow/scenarios_triggers.py).
# A sub-folder, so the duplicate-run suites that iterate over every <ver>/*.json do not pick them up.
#
#   scripts/airflow/regen_triggers.sh [VERSION...]   (default: all four)
#   ONLY="flip_callback" scripts/airflow/regen_triggers.sh 3.2.2 3.3.2   (those scenarios only)
#
# Per scenario: fresh DB af_trg_<ver>_<scenario> -> `airflow db migrate` -> generator (dumps the DB
# after each step and writes the .json ground truth) -> every dump loaded with ON_ERROR_STOP into a
# DB made from tests/fixtures/schema/airflow-<ver>.sql.
set -euo pipefail
cd "$(dirname "$0")/../.."
declare -A SCENARIOS=(
  [3.0.6]="flip_asset"
  [3.1.2]="flip_asset flip_callback stale_owner ended_owner recreated"
  [3.2.2]="flip_asset flip_callback"
  [3.3.2]="flip_asset flip_callback"
)
if [ $# -gt 0 ]; then VERSIONS=("$@"); else VERSIONS=(3.0.6 3.1.2 3.2.2 3.3.2); fi
export PGOPTIONS="-c client_min_messages=warning"
BASE_URL=$(scripts/postgres.sh start)
SERVER="${BASE_URL%/*}"
PSQL=$(ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1)
PSQL="${PSQL:-psql}"
for ver in "${VERSIONS[@]}"; do
  scripts/airflow/venv.sh "$ver" >/dev/null
  out="tests/fixtures/scenarios/$ver/triggers"
  mkdir -p "$out"
  for sc in ${ONLY:-${SCENARIOS[$ver]}}; do
    db="af_trg_${ver//./_}_$sc"
    "$PSQL" "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
    home="/tmp/dupguard-airflow-home/trg-$ver-$sc"   # stable path: it ends up in dag.fileloc
    rm -rf "$home"; mkdir -p "$home"
    log="/tmp/dupguard-trigger-scenario-$ver-$sc.log"
    AIRFLOW_HOME="$home" scripts/airflow/af.sh "$ver" "$SERVER/$db" airflow db migrate >"$log" 2>&1 \
      || { cat "$log" >&2; exit 1; }
    rm -f "$out/$sc".*.sql
    AIRFLOW_HOME="$home" scripts/airflow/af.sh "$ver" "$SERVER/$db" \
      python scripts/airflow/scenarios_triggers.py --scenario "$sc" --out-dir "$out" 2>>"$log" \
      || { cat "$log" >&2; exit 1; }
    chk="af_trg_check"
    for f in "$out/$sc".*.sql; do
      "$PSQL" "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $chk WITH (FORCE)" -c "CREATE DATABASE $chk"
      "$PSQL" "$SERVER/$chk" -qX -v ON_ERROR_STOP=1 -f "tests/fixtures/schema/airflow-$ver.sql" >/dev/null
      "$PSQL" "$SERVER/$chk" -qX -v ON_ERROR_STOP=1 -f "$f" >/dev/null
    done
    "$PSQL" "$BASE_URL" -qX -c "DROP DATABASE IF EXISTS $chk WITH (FORCE)" >/dev/null
    echo "load check ok: $out/$sc ($(ls "$out/$sc".*.sql | wc -l) dumps, $(cat "$out/$sc".*.sql | wc -c) bytes)"
  done
done

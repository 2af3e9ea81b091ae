#!/usr/bin/env bash
# Regenerates the partitioned-asset scenario fixtures (tests/fixtures/scenarios/<ver>/<scenario>.{sql,json})
# with Airflow's own code: see the docstring of scripts/airflow/scenarios_partitioned.py.
#
# Needs the Airflow virtualenvs .airflow-venvs/<ver>/ (scripts/airflow/venv.sh <ver>) and the test
# PostgreSQL (scripts/postgres.sh start). Each scenario gets its own fresh database
# af_part_<ver with _>_<scenario> (left in place for inspection).
# Afterwards every .sql is loaded with ON_ERROR_STOP into a scratch database built from
# tests/fixtures/schema/airflow-<ver>.sql, when that schema fixture exists.
#
#   scripts/airflow/regen_partitioned.sh            # all versions / scenarios
#   scripts/airflow/regen_partitioned.sh 3.2.2      # one version
set -euo pipefail
cd "$(dirname "$0")/../.."

PG_URL="${DUPGUARD_TEST_PG_URL:-$(scripts/postgres.sh start)}"
PSQL=$(ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1)
PSQL="${PSQL:-psql}"

declare -A SCENARIOS=(
  [3.2.2]="race_partitioned partition_fanout partition_successive partition_rerun split_and split_or"
  [3.3.2]="race_partitioned race_asset partition_rerun split_and split_or"
)
if [ $# -gt 0 ]; then VERSIONS=("$@"); else VERSIONS=(3.2.2 3.3.2); fi

start=$SECONDS
for ver in "${VERSIONS[@]}"; do
  py=".airflow-venvs/$ver/bin/python"
  if [ ! -f ".airflow-venvs/$ver/.ready" ]; then
    echo "missing $py (build it with scripts/airflow/venv.sh $ver)" >&2
    exit 1
  fi
  out="tests/fixtures/scenarios/$ver"
  for scenario in ${SCENARIOS[$ver]}; do
    "$py" scripts/airflow/scenarios_partitioned.py --scenario "$scenario" --out-dir "$out" --pg-url "$PG_URL"
  done

  schema="tests/fixtures/schema/airflow-$ver.sql"
  if [ ! -f "$schema" ]; then
    echo "WARNING: $schema not found; load check of $out skipped" >&2
    continue
  fi
  check_db="af_part_loadcheck"
  check_url="${PG_URL%/*}/$check_db"
  for scenario in ${SCENARIOS[$ver]}; do
    "$PSQL" -q -v ON_ERROR_STOP=1 "$PG_URL" \
      -c "DROP DATABASE IF EXISTS $check_db WITH (FORCE)" -c "CREATE DATABASE $check_db"
    "$PSQL" -q -v ON_ERROR_STOP=1 "$check_url" -f "$schema" >/dev/null
    "$PSQL" -q -v ON_ERROR_STOP=1 "$check_url" -f "$out/$scenario.sql" >/dev/null
    size=$(stat -c %s "$out/$scenario.sql")
    [ "$size" -lt 307200 ] || { echo "$out/$scenario.sql is $size bytes (>= 300 KB)" >&2; exit 1; }
    echo "load check ok: $out/$scenario.sql ($size bytes)"
  done
  "$PSQL" -q "$PG_URL" -c "DROP DATABASE IF EXISTS $check_db WITH (FORCE)"
done
echo "regen_partitioned: done in $((SECONDS - start)) s"

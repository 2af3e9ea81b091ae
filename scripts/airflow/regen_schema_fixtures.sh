#!/usr/bin/env bash
# Regenerates tests/fixtures/schema/airflow-<ver>.sql: the real metadata schema that each Airflow
# version creates with `airflow db migrate` on PostgreSQL, plus its alembic_version row (dupguard
# detects the Airflow version from it). Each file is checked to load into an empty database with
# `psql -v ON_ERROR_STOP=1`.
#
#   scripts/airflow/regen_schema_fixtures.sh [VERSION...]   (default: all five versions)
# Needs the test PostgreSQL (scripts/postgres.sh start) and builds missing venvs via venv.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.0.6 3.1.2 3.2.2 3.3.2 2.10.5)
export PGOPTIONS="-c client_min_messages=warning"
BASE_URL=$(scripts/postgres.sh start)        # postgresql://postgres@127.0.0.1:PORT/postgres
SERVER="${BASE_URL%/*}"
OUT=tests/fixtures/schema
mkdir -p "$OUT"

for ver in "${VERSIONS[@]}"; do
  t0=$(date +%s)
  scripts/airflow/venv.sh "$ver" >/dev/null
  db="af_schema_${ver//./_}"
  psql "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" -c "CREATE DATABASE $db"
  scripts/airflow/af.sh "$ver" "$SERVER/$db" airflow db migrate >"/tmp/af-migrate-$ver.log" 2>&1 \
    || { cat "/tmp/af-migrate-$ver.log" >&2; exit 1; }
  rev=$(psql "$SERVER/$db" -qXAt -c "SELECT version_num FROM alembic_version")
  f="$OUT/airflow-$ver.sql"
  {
    echo "-- Airflow $ver metadata schema (PostgreSQL), made by scripts/airflow/regen_schema_fixtures.sh"
    echo "-- from a fresh 'airflow db migrate'. Alembic head: $rev"
    # Drop lines that only matter for pg_dump's own restore and break loading into a DB that
    # already has them / is a different server version (search_path reset is kept off on purpose).
    pg_dump --schema-only --no-owner --no-privileges --no-comments "$SERVER/$db" \
      | grep -v -E '^(SET transaction_timeout|SELECT pg_catalog.set_config\(.search_path)' \
      | grep -v -E '^\\(restrict|unrestrict) '
    echo
    echo "-- alembic_version row (dupguard reads the Airflow version from it)"
    echo "INSERT INTO public.alembic_version (version_num) VALUES ('$rev');"
  } >"$f.tmp"
  mv "$f.tmp" "$f"
  # Check: loads into an empty database.
  chk="af_schema_check"
  psql "$BASE_URL" -qX -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $chk WITH (FORCE)" -c "CREATE DATABASE $chk"
  psql "$SERVER/$chk" -qX -v ON_ERROR_STOP=1 -f "$f" >/dev/null
  got=$(psql "$SERVER/$chk" -qXAt -c "SELECT version_num FROM alembic_version")
  [ "$got" = "$rev" ] || { echo "check failed for $f" >&2; exit 1; }
  psql "$BASE_URL" -qX -c "DROP DATABASE $chk" >/dev/null
  echo "$f: alembic $rev, $(wc -c <"$f") bytes, $(( $(date +%s) - t0 ))s"
done

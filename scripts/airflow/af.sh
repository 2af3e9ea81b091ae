#!/usr/bin/env bash
# Runs a command with the environment that points a real Airflow (from .airflow-venvs/VERSION)
# at a given PostgreSQL database, with a throw-away AIRFLOW_HOME.
#
#   scripts/airflow/af.sh VERSION DB_URL airflow db migrate
#   scripts/airflow/af.sh VERSION DB_URL python some_script.py
#   eval "$(scripts/airflow/af.sh --print-env VERSION DB_URL)"   # just print the exports
#
# DB_URL may be postgresql://, postgres:// or postgresql+psycopg2:// (it is normalised to psycopg2).
# Commands `airflow` and `python` resolve to the venv's binaries. Extra AIRFLOW__* variables already
# set in the caller's environment win over the defaults below.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PRINT=""
if [ "${1:-}" = "--print-env" ]; then PRINT=1; shift; fi
VERSION="${1:?usage: $0 [--print-env] VERSION DB_URL [command...]}"
DB_URL="${2:?usage: $0 [--print-env] VERSION DB_URL [command...]}"
shift 2
VENV="$ROOT/.airflow-venvs/$VERSION"
[ -x "$VENV/bin/airflow" ] || { echo "af.sh: $VENV missing; run scripts/airflow/venv.sh $VERSION" >&2; exit 1; }

case "$DB_URL" in
  postgresql+psycopg2://*) CONN="$DB_URL" ;;
  postgresql://*) CONN="postgresql+psycopg2://${DB_URL#postgresql://}" ;;
  postgres://*) CONN="postgresql+psycopg2://${DB_URL#postgres://}" ;;
  *) echo "af.sh: unsupported DB URL $DB_URL" >&2; exit 2 ;;
esac

HOME_DIR="${AIRFLOW_HOME:-$(mktemp -d -t airflow-home-XXXXXX)}"
mkdir -p "$HOME_DIR/dags"
declare -A ENVV=(
  [AIRFLOW_HOME]="$HOME_DIR"
  [AIRFLOW__DATABASE__SQL_ALCHEMY_CONN]="$CONN"
  [AIRFLOW__CORE__LOAD_EXAMPLES]=False
  [AIRFLOW__CORE__EXECUTOR]=LocalExecutor
  [AIRFLOW__CORE__DAGS_FOLDER]="$HOME_DIR/dags"
  [AIRFLOW__CORE__UNIT_TEST_MODE]=False
  [AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING]=True
  [AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS]=False
  [AIRFLOW__LOGGING__LOGGING_LEVEL]=WARNING
  [AIRFLOW__API_AUTH__JWT_ISSUER]=airflow
  [AIRFLOW__API_AUTH__JWT_SECRET]=dupguard-test-secret
  [AIRFLOW__API__SECRET_KEY]=dupguard-test-secret
  [AIRFLOW__WEBSERVER__SECRET_KEY]=dupguard-test-secret
)
for k in "${!ENVV[@]}"; do
  # caller's value wins, except AIRFLOW_HOME/connection which are what this helper is for
  case "$k" in AIRFLOW_HOME|AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) ;;
    *) if [ -n "${!k:-}" ]; then ENVV[$k]="${!k}"; fi ;;
  esac
done

if [ -n "$PRINT" ]; then
  for k in "${!ENVV[@]}"; do printf 'export %s=%q\n' "$k" "${ENVV[$k]}"; done
  printf 'export PATH=%q:"$PATH"\n' "$VENV/bin"
  exit 0
fi
[ $# -gt 0 ] || { echo "af.sh: no command given" >&2; exit 2; }
for k in "${!ENVV[@]}"; do export "$k=${ENVV[$k]}"; done
export PATH="$VENV/bin:$PATH" VIRTUAL_ENV="$VENV"
exec "$@"

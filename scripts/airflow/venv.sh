#!/usr/bin/env bash
# Creates .airflow-venvs/VERSION/ with a real apache-airflow==VERSION (+ psycopg2-binary, asyncpg;
# + apache-airflow-providers-celery for 3.1.2 and 3.2.2, the end-to-end harness's CeleryExecutor;
# + the AWS provider and moto for 3.1.2, the SQS AssetWatcher end to end),
# used by the Airflow-backed tests and by the fixture generators in this folder.
#
# Why pinned: without Airflow's own constraints file, the resolver picks the newest of everything
# (e.g. SQLAlchemy 2.1.x, which Airflow 3.0/3.1 cannot use). Airflow's constraint files live on
# GitHub, which CI cannot reach, so we resolve a working set once and commit it as
# constraints/airflow-VERSION.txt. A fresh resolve uses `--exclude-newer` = a few days after that
# Airflow release (so dependencies are what was current when it shipped) plus a few known pins.
#
#   scripts/airflow/venv.sh VERSION        idempotent; writes .airflow-venvs/VERSION/.ready at the end
#                                          (a hash of the requirements and the constraints file: a venv
#                                          made before either changed is brought up to date)
#   REFREEZE=1 scripts/airflow/venv.sh V   ignore (and rewrite) the committed constraints file
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION="${1:?usage: $0 AIRFLOW_VERSION}"
VENV=".airflow-venvs/$VERSION"
CONS="constraints/airflow-$VERSION.txt"
export UV_PYTHON_DOWNLOADS=never

mkdir -p .airflow-venvs constraints
# Two callers (e.g. CI jobs, or a test waiting for the venv) must not build the same venv at once.
exec 9>".airflow-venvs/.lock-$VERSION"
flock 9

airflow_ok() {
  local home
  home=$(mktemp -d)
  AIRFLOW_HOME="$home" AIRFLOW__CORE__LOAD_EXAMPLES=False "$VENV/bin/airflow" version 2>/dev/null | tail -n1 \
    | grep -qx "$VERSION"
  local rc=$?
  rm -rf "$home"
  return $rc
}

REQS=("apache-airflow==$VERSION" psycopg2-binary asyncpg)
case "$VERSION" in
  # The seed's executor (tests/e2e: CeleryExecutor with Redis); pinned in the constraints file too.
  3.1.2|3.2.2) REQS+=(apache-airflow-providers-celery) ;;
esac
# The SQS AssetWatcher end to end (tests/e2e/dags_sqs): the AWS provider's own SqsSensorTrigger
# (it needs aiobotocore) against moto's server, which speaks the SQS API locally.
if [ "$VERSION" = 3.1.2 ]; then REQS+=("apache-airflow-providers-amazon[aiobotocore]" "moto[server]"); fi
STAMP=$( { echo "${REQS[*]}"; cat "$CONS" 2>/dev/null || true; } | sha256sum | cut -d' ' -f1)

if [ -f "$VENV/.ready" ] && [ "$(cat "$VENV/.ready")" = "$STAMP" ] && [ -z "${REFREEZE:-}" ] && airflow_ok; then
  echo "$VENV: ready"
  exit 0
fi
rm -f "$VENV/.ready"

# Release date of each Airflow version we test (PyPI upload time), plus 3 days for same-week fixes
# of its dependencies. Extra pins: the SQLAlchemy line each version supports.
case "$VERSION" in
  2.10.5) CUTOFF=2025-02-13; PINS=("sqlalchemy>=1.4.49,<2.0" "sqlalchemy-utils<0.42") ;;
  3.0.6)  CUTOFF=2025-09-01; PINS=("sqlalchemy>=1.4.49,<2.0" "sqlalchemy-utils<0.42" "alembic<1.17") ;;
  3.1.2)  CUTOFF=2025-11-08; PINS=("sqlalchemy>=1.4.49,<2.0" "sqlalchemy-utils<0.42" "alembic<1.17") ;;
  3.2.2)  CUTOFF=2026-06-01; PINS=("sqlalchemy<2.1") ;;
  3.3.2)  CUTOFF=2026-09-20; PINS=("sqlalchemy<2.1") ;;
  *)      CUTOFF=""; PINS=("sqlalchemy<2.1") ;;
esac

PY=$(python3.11 -c 'import sys; print(sys.executable)')
[ -x "$VENV/bin/python" ] || uv venv -q --python "$PY" "$VENV"
export VIRTUAL_ENV="$PWD/$VENV"

if [ -f "$CONS" ] && [ -z "${REFREEZE:-}" ]; then
  echo "$VENV: installing from $CONS" >&2
  uv pip install -q -c "$CONS" "${REQS[@]}"
else
  echo "$VENV: resolving (exclude-newer ${CUTOFF:-none}) and writing $CONS" >&2
  args=()
  [ -n "$CUTOFF" ] && args+=(--exclude-newer "${CUTOFF}T00:00:00Z")
  uv pip install -q "${args[@]}" "${REQS[@]}" "${PINS[@]}"
  {
    echo "# Working dependency set for apache-airflow==$VERSION on Python 3.11 (written by scripts/airflow/venv.sh)."
    echo "# Resolved with --exclude-newer ${CUTOFF:-none} and pins: ${PINS[*]}"
    uv pip freeze
  } >"$CONS.tmp"
  mv "$CONS.tmp" "$CONS"
fi

if ! airflow_ok; then
  echo "$VENV: 'airflow version' failed:" >&2
  AIRFLOW_HOME=$(mktemp -d) "$VENV/bin/airflow" version >&2 || true
  exit 1
fi
STAMP=$( { echo "${REQS[*]}"; cat "$CONS"; } | sha256sum | cut -d' ' -f1)  # REFREEZE rewrote it
echo "$STAMP" >"$VENV/.ready"
echo "$VENV: ready"

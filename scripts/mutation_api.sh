#!/usr/bin/env bash
# The `api` remediation backend under mutation (benchmarks/results/mutation.md, "The command"), called by
# scripts/mutation.sh. Its tests need real Airflow API servers and mutmut runs one pytest per mutant,
# so the servers are started once and held for the whole run (tests/airflow_hold.py), then stopped.
# mutmut reads its settings from pyproject.toml only, so the run is made in a copy of the tree whose
# [tool.mutmut] names api.py and the tests that reach it (the `airflow` marker left in): the main
# run leaves those tests out, and two mutmut runs must not share one mutants/ directory.
# Writes mutants/results-api.txt and prints its score. Arguments: mutant names or globs to run only
# those (mutmut run's). MUTMUT_CHILDREN: parallel workers (default 1: the held servers are shared, so
# two children's tests would reset the same live database at once).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
: "${DUPGUARD_TEST_DATABASE_URL:?set by scripts/mutation.sh (scripts/postgres.sh start)}"
for version in 3.0.6 3.1.2 3.2.2; do scripts/airflow/venv.sh "$version" >/dev/null; done
work="$(mktemp -d /tmp/dupguard-mutation-api.XXXXXX)"
held_pid=""
cleanup() {
  if [ -n "$held_pid" ]; then
    kill "$held_pid" 2>/dev/null || true  # airflow_hold stops its servers and drops their databases
    wait "$held_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
mkdir "$work/tree"
tar --exclude=./mutants --exclude=./.git --exclude=./.venv --exclude=./.airflow-venvs -cf - . | (cd "$work/tree" && tar xf -)
ln -s "$root/.venv" "$work/tree/.venv"
ln -s "$root/.airflow-venvs" "$work/tree/.airflow-venvs"
.venv/bin/python - "$work/tree/pyproject.toml" <<'EOF'
import sys
from pathlib import Path

path = Path(sys.argv[1])
text = path.read_text()
start = text.index("[tool.mutmut]")
end = text.find("\n[", start)
section = '''[tool.mutmut]
source_paths = ["detector"]
only_mutate = ["detector/actions/remediation/api.py"]
pytest_add_cli_args_test_selection = [
    "tests/unit/test_fence.py",
    "tests/unit/test_remediation_readback.py",
    "tests/unit/test_api_source_settings.py",
    "tests/unit/test_guarded_prepare.py",
    "tests/unit/test_api_backend_build.py",
    "tests/integration/test_remediation_api.py",
    "tests/integration/test_remediation_api30.py",
    "tests/integration/test_api_backend_mutants.py",
]
pytest_add_cli_args = ["-p", "no:cacheprovider"]
'''
path.write_text(text[:start] + section + ("" if end < 0 else text[end:]))
EOF
# The servers and settings the selected tests' fixtures ask for (tests/airflow_server.py, "Held servers").
(cd "$work/tree" && exec .venv/bin/python -m tests.airflow_hold "$work/held.json" \
  3.1.2:6:race_asset_fanout,race_asset 3.2.2:3600:race_partitioned 3.0.6:3600:race_asset_fanout) \
  >"$work/held.log" 2>&1 &
held_pid=$!
until [ -s "$work/held.json" ]; do
  if ! kill -0 "$held_pid" 2>/dev/null; then
    tail -n 40 "$work/held.log" >&2
    exit 1
  fi
  sleep 2
done
log="$work/run.log"  # mutmut redraws a progress line many times a second: kept, not shown
(cd "$work/tree" && DUPGUARD_TEST_AIRFLOW_SERVERS="$work/held.json" \
  .venv/bin/mutmut run --max-children "${MUTMUT_CHILDREN:-1}" "$@") >"$log" 2>&1 || {
  tail -n 40 "$log" >&2
  exit 1
}
mkdir -p mutants
(cd "$work/tree" && .venv/bin/mutmut results --all true) >mutants/results-api.txt
.venv/bin/python scripts/mutation_score.py mutants/results-api.txt

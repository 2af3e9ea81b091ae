#!/usr/bin/env bash
# Mutation testing of the safety core (benchmarks/results/mutation.md): mutmut 3 mutates the modules
# listed in pyproject's [tool.mutmut] only_mutate and runs, for each mutant, the tests that call the
# mutated function (tests/unit and the PostgreSQL integration tests; the `airflow` and `e2e` markers
# are left out: they start Airflow processes, minutes per mutant). Not part of CI: about an hour on
# two cores. Prints the score per module; `.venv/bin/mutmut show NAME` shows a survivor's diff.
# MUTMUT_CHILDREN sets the parallel workers (default 2). Then the api backend, whose tests need real
# Airflow API servers: scripts/mutation_api.sh holds them for its own run (MUTATION_API=0 skips it);
# and the guard inside real Airflow: scripts/mutation_guard.sh (MUTATION_GUARD=0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
# Only this target needs mutmut, so it is not in the `test` extra (CI never installs it).
if command -v uv >/dev/null 2>&1; then
  VIRTUAL_ENV=$PWD/.venv uv pip install -q "mutmut==3.8.1"
else
  .venv/bin/pip install -q "mutmut==3.8.1"
fi
DUPGUARD_TEST_DATABASE_URL="$(scripts/postgres.sh start)"
export DUPGUARD_TEST_DATABASE_URL
rm -rf mutants  # mutmut keeps results between runs; a score is only meaningful for this tree
log="$(mktemp)"  # mutmut redraws a progress line many times a second: kept, not shown
.venv/bin/mutmut run --max-children "${MUTMUT_CHILDREN:-2}" >"$log" 2>&1 || {
  tail -n 40 "$log" >&2
  exit 1
}
mv "$log" mutants/run.log
.venv/bin/mutmut results --all true >mutants/results.txt
.venv/bin/python scripts/mutation_score.py mutants/results.txt
if [ "${MUTATION_API:-1}" != 0 ]; then
  MUTMUT_CHILDREN=1 scripts/mutation_api.sh
fi
if [ "${MUTATION_GUARD:-1}" != 0 ]; then
  scripts/mutation_guard.sh
fi

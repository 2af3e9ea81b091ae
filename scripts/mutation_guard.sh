#!/usr/bin/env bash
# The guard's decision (detector/guard/policy.py) under mutation, inside real Airflow 3.1.2 and 3.2.2
# (benchmarks/results/mutation.md, "The guard's decision"), called by scripts/mutation.sh. mutmut only writes the
# mutants; tests/guard/mutants.py runs them in one Airflow process per pass, judged by
# tests/guard/test_guard.py's own assertions (scripts/mutation_guard.py). Writes
# mutants/results-guard.txt (mutmut results' format) and .jsonl (each verdict: the failing test or
# the scenario's error) and prints the score. Arguments: globs of mutant names to run only those, in
# that order (default: every mutant; about 10 s each here).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${DUPGUARD_TEST_DATABASE_URL:?set by scripts/mutation.sh (scripts/postgres.sh start)}"
for version in 3.1.2 3.2.2; do scripts/airflow/venv.sh "$version" >/dev/null; done
mkdir -p mutants
.venv/bin/python scripts/mutation_guard.py mutants/results-guard.txt "$@"
.venv/bin/python scripts/mutation_score.py mutants/results-guard.txt

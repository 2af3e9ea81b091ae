#!/usr/bin/env bash
# Re-run exactly the measurements behind the figures rendered into README.md and docs/, then render
# them (scripts/render_figures.py). Short runs sized for a shared 2-core machine: about 10 minutes.
# Run it on a clean, committed tree: the renderer refuses results of uncommitted code.
#
#   scripts/remeasure_figures.sh            # every record, tagged with today's date
#   scripts/remeasure_figures.sh detection  # only some: detection scan remediation guard
#
# Needs DUPGUARD_TEST_DATABASE_URL (remediation, guard: the test PostgreSQL) and the Airflow 3.1.2
# venv under .airflow-venvs; detection and scan start PostgreSQL clusters of their own.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TAG=${TAG:-$(date -u +%Y%m%d)}
WHAT=${*:-detection scan remediation guard}

if [ -n "$(git status --porcelain -- detector benchmarks ':(exclude)benchmarks/results')" ]; then
  echo "uncommitted changes under detector/ or benchmarks/: commit them first" >&2
  exit 1
fi

for what in $WHAT; do
  echo "== $what ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  case $what in
    detection)  # latency p50/p99 pooled over 102 detections, idle CPU and RSS, at the default poll (5ms, at rest 250ms); each pair
      # after its queue row, with leads Airflow's schedulers showed end to end, spaced beyond the poll's hold
      # so that every pair starts at rest (docs/explanation/daemon.md, "How the daemon polls")
      $PY -m benchmarks.detection_latency --repeats 3 --pairs 34 --idle 10 --intervals 5ms --modes poll \
        --lead file:benchmarks/results/e2e_poll-rest-after-local.json --spacing 5.5:6.5 --tag "$TAG" ;;
    scan)  # `dupguard scan --since 1d` at 1M runs (the 1M history, ~5 min to build, is reused)
      $PY benchmarks/history.py --sizes 1m
      $PY benchmarks/scan_cost.py --sizes 1m --repeat 3 --repeat-full 1 --tag "$TAG" ;;
    remediation)  # detection -> committed state change, db and api backends, real Airflow 3.1.2
      $PY -m benchmarks.remediation_latency --samples 100 --name "remediation_latency-$TAG" ;;
    guard)  # the guard's hook per created run, Airflow 3.1.2, 50 asset DAGs
      $PY -m benchmarks.guard_cost --rounds 5 --repeat 2 --name "guard_cost-$TAG" ;;
    *) echo "unknown measurement: $what" >&2; exit 2 ;;
  esac
done
$PY scripts/render_figures.py

"""End to end on the reporter's stack: a real HA Airflow 3.1.2 with dupguard in front.

The short CI version (the full matrix is ``benchmarks/e2e_catch_rate.py``, benchmarks/results/e2e.md), one cluster:
two schedulers on PostgreSQL with the **CeleryExecutor** (Redis broker, PostgreSQL result backend,
two ``airflow celery worker``), the **triggerer** with an AssetWatcher whose event trigger fires when
the harness writes a file (so asset events come from the triggerer as well as from the producer's
outlet), the seed's consumer, a fan-out consumer, ``consumer_serial``, the watched asset's consumer and
a consumer of **two assets** (the overlap race). **Two dupguard replicas**; the leader is SIGKILLed once
at a random moment (and restarted 1 s later), and the **API server is stopped for 20 s** once.
Fault injection on (a random 0-500 ms delay between the scheduler's unlocked queue read and its
DagModel lock) so a short run sees enough duplicates; remediation ``fail`` through the REST API.

It asserts the hard guarantees on ground truth read from the database after the run: every duplicate
group detected, no false positive, no action on a kept run; and that the faults happened (the
triggerer made asset events, the leader was killed and another replica took over, the API server was
down). The catch rate and the outage outcome are printed and written to ``<tmp>/e2e-report.json``, not
asserted: they depend on the machine's load (benchmarks/results/e2e.md reports them from the benchmark).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, RunSpec, run
from tests.e2e.truth import summary_line

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.airflow]

DURATION = float(os.environ.get("DUPGUARD_E2E_DURATION", "60"))


@pytest.mark.timeout(900)
def test_reporters_stack_duplicates_are_detected_and_only_duplicates_stopped(tmp_path: Path) -> None:
    """Two real schedulers race on the user's DAGs and on triggerer-made events, with Celery workers,
    a killed leader and an API outage; dupguard detects every duplicate group, reports no false
    positive and never touches a kept run."""
    venv = ROOT / ".airflow-venvs" / "3.1.2"
    if not (venv / ".ready").exists():
        pytest.fail(
            f"{venv} is missing or incomplete: run scripts/airflow/venv.sh 3.1.2 "
            "(the end-to-end test needs a real Airflow 3.1.2 to run two schedulers)",
            pytrace=False,
        )
    spec = RunSpec(
        name="ci-short",
        executor="celery",
        watcher=True,
        replicas=2,
        leader_kills=1,
        api_outage=20.0,
        backend="api",
        mode="fail",
        fault_max_ms=500,
        duration=DURATION,
    )
    report = run(spec, tmp_path / "run")
    (tmp_path / "e2e-report.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n" + summary_line(report) + f"\nreport: {tmp_path / 'e2e-report.json'}")

    where = f"(logs and report.json in {report['run_dir']})"
    assert report["asset_events"] > 0, f"the producer emitted no asset event {where}"
    assert report["asset_events_from_trigger"] > 0, f"the triggerer made no asset event {where}"
    assert report["duplicate_groups"] > 0, f"no duplicate group in {report['asset_events']} events {where}"
    assert report["undetected_groups"] == [], f"groups dupguard never detected: {report['undetected_groups']} {where}"
    assert report["groups_detected"] == report["duplicate_groups"]
    assert report["false_positives"] == 0, f"false positives: {report['false_positive_details']} {where}"
    assert report["remediations_of_kept_runs"] == 0, f"kept runs touched: {report['kept_run_violations']} {where}"
    assert report["done_but_started"] == [], f"mid-run stops logged as clean: {report['done_but_started']} {where}"
    assert report["leader_kills"] == 1, f"the leader was not killed: {report['faults']} {where}"
    assert report["kills_without_takeover"] == 0, f"no replica took over after the kill {where}"
    assert "outage" in report, f"the API server was not stopped: {report['faults']} {where}"

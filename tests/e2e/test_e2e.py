"""End to end on a real HA Airflow 3.1.2 (two schedulers, LocalExecutor, PostgreSQL) with dupguard in front.

The short CI version of issue 8 (the full matrix is ``benchmarks/e2e_catch_rate.py``, docs/e2e.md):
fault injection on (a random 0-500 ms delay between the scheduler's unlocked queue read and its
DagModel lock, so a few minutes give enough duplicates), remediation ``fail`` through the REST API.
It asserts only the hard guarantees, on ground truth read from the database after the run:
every duplicate group detected, no false positive, no action on a kept run. The catch rate is
printed and written to ``<tmp>/e2e-report.json``, not asserted (it depends on the machine's load).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.harness import ROOT, RunSpec, run
from tests.e2e.truth import summary_line

pytestmark = [pytest.mark.e2e, pytest.mark.integration, pytest.mark.airflow]

DURATION = float(os.environ.get("DUPGUARD_E2E_DURATION", "150"))


@pytest.mark.timeout(900)
def test_ha_airflow_duplicates_are_detected_and_only_duplicates_stopped(tmp_path: Path) -> None:
    """Two real schedulers race on the user's DAGs; dupguard detects every duplicate group, reports
    no false positive and never touches a kept run."""
    venv = ROOT / ".airflow-venvs" / "3.1.2"
    if not (venv / ".ready").exists():
        pytest.fail(
            f"{venv} is missing or incomplete: run scripts/airflow/venv.sh 3.1.2 "
            "(the end-to-end test needs a real Airflow 3.1.2 to run two schedulers)",
            pytrace=False,
        )
    spec = RunSpec(name="ci-short", backend="api", mode="fail", fault_max_ms=500, duration=DURATION)
    report = run(spec, tmp_path / "run")
    (tmp_path / "e2e-report.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n" + summary_line(report) + f"\nreport: {tmp_path / 'e2e-report.json'}")

    where = f"(logs and report.json in {report['run_dir']})"
    assert report["asset_events"] > 0, f"the producer emitted no asset event {where}"
    assert report["duplicate_groups"] > 0, f"no duplicate group in {report['asset_events']} events {where}"
    assert report["undetected_groups"] == [], f"groups dupguard never detected: {report['undetected_groups']} {where}"
    assert report["groups_detected"] == report["duplicate_groups"]
    assert report["false_positives"] == 0, f"false positives: {report['false_positive_details']} {where}"
    assert report["remediations_of_kept_runs"] == 0, f"kept runs touched: {report['kept_run_violations']} {where}"

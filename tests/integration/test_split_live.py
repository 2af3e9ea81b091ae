"""Airflow 3.3.2's own code, run by the suite (not a stored fixture): the split of apache/airflow#71070
still happens with the venv built from constraints/airflow-3.3.2.txt, and dupguard judges what it made.

``scripts/airflow/scenarios_partitioned.py --scenario split_or`` migrates a fresh database, has two
producer assets register one partition key at the same moment and runs one scheduler pass; it
checks Airflow's outcome itself (two rows, two runs, one event each) and writes the ground truth.
About 15-30 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from detector.app.cli import main
from tests.airflow_server import venv_for
from tests.pg import ROOT, admin_url, database_url, execute_admin

pytestmark = pytest.mark.integration


def clean_env() -> dict[str, str]:
    """This environment without anything that would point Airflow or Python elsewhere."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DUPGUARD_"))}


def test_airflow_332_splits_a_key_and_scan_confirms_its_two_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    python = venv_for("3.3.2") / "bin" / "python"
    db = f"live_split_{uuid.uuid4().hex[:10]}"
    try:
        made = subprocess.run(
            [str(python), str(ROOT / "scripts/airflow/scenarios_partitioned.py"), "--scenario", "split_or",
             "--out-dir", str(tmp_path), "--pg-url", admin_url(), "--db", db],
            env=clean_env(), capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert made.returncode == 0, made.stderr[-3000:]
        truth = json.loads((tmp_path / "split_or.json").read_text())
        [expected] = truth["expected_groups"]
        assert main(["scan", "--database-url", database_url(db), "--format", "json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        [group] = doc["groups"]
        assert (group["kind"], group["confidence"]) == ("partitioned", "confirmed")
        assert sorted([group["kept_run_id"], *group["duplicate_run_ids"]]) == sorted(expected["run_ids"])
        assert doc["split_partitions"] == []
    finally:
        execute_admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')

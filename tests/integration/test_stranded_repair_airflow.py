"""THE repair test of stranded events: after dupguard's requeue, Airflow's own scheduler code makes the run,
and that run consumed exactly the stranded events (every version, on the dumps Airflow made)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from detector.checks.stranded_events import statements
from detector.checks.stranded_events.requeue import RequeueWriter
from detector.checks.stranded_events.rule import find_stranded
from detector.metadb.engine import connect, make_engine, open_airflow_db, parse_url
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
LOOP = Path(__file__).with_name("airflow_scheduler_loop.py")


def airflow_loop(version: str, url: str, dag_id: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """One run-creation step of Airflow ``version``'s scheduler on ``url``: what the DAG's runs are then."""
    python = ROOT / ".airflow-venvs" / version / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"Airflow {version} venv missing ({python}): scripts/airflow/venv.sh {version} (scripts/test.sh)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV", "DUPGUARD_"))}
    env |= {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url.replace("postgresql://", "postgresql+psycopg2://", 1),
    }
    proc = subprocess.run(
        [str(python), str(LOOP), dag_id, *extra], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize("scenario", ["stranded_race", "stranded_max_active"])
@pytest.mark.parametrize("version", ["3.0.6", "3.1.2", "3.2.2", "3.3.2"])
def test_airflows_scheduler_consumes_exactly_the_stranded_events_after_the_requeue(
    version: str, scenario: str, pg_templates: Templates, tmp_path: Path
) -> None:
    [truth] = ground_truth(version, scenario)["expected_stranded"]
    url = pg_templates.clone(version, scenario)
    before = airflow_loop(version, url, truth["dag_id"], tmp_path)["runs"]  # without the repair: no run
    db = open_airflow_db(make_engine(parse_url(url)))
    with connect(db.engine) as conn:
        [stranded] = find_stranded(statements.stranded_event_candidates(conn, db.tables, None))
    written = RequeueWriter(db.engine, db.tables).write(stranded)
    assert written.outcome == "requeued" and written.plan is not None, written
    after = airflow_loop(version, url, truth["dag_id"], tmp_path)
    if scenario == "stranded_max_active":  # max_active_runs=1: the scheduler waits for the active run
        assert after["runs"] == before
        after = airflow_loop(version, url, truth["dag_id"], tmp_path, "--finish-active")
    assert after["version"] == version
    [new] = [r for r in after["runs"] if r["run_id"] not in {b["run_id"] for b in before}]
    assert len(before) == len(after["runs"]) - 1
    assert new["event_ids"] == truth["event_ids"]  # consumed by Airflow: exactly the stranded events
    assert datetime.fromisoformat(new["run_after"]) == written.plan.created_at
    assert new["run_type"] == "asset_triggered"
    with connect(db.engine) as conn:  # and nothing is stranded any more, no queue row is left
        assert find_stranded(statements.stranded_event_candidates(conn, db.tables, None)) == []
        assert conn.execute(db.tables.asset_queue.select()).all() == []  # type: ignore[union-attr]

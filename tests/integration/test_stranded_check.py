"""The stranded_events check plugged in: `dupguard scan --format json` and the daemon (`run --once`),
on databases made by Airflow's own code (scripts/airflow/scenarios_stranded.py). Ground truth is
``expected_stranded``: the events Airflow consumed by no run and queued nowhere."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from detector.app.cli import main
from detector.app.ledger import MemoryLedger
from detector.metrics import Metrics
from tests.integration.test_split_partitions import SplitRecorder, _daemon  # the same daemon, another fixture
from tests.pg import Templates, execute_admin, ground_truth

pytestmark = pytest.mark.integration


def _scan(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--database-url", url, "--format", "json", *extra])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("version", ["3.0.6", "3.3.2"])
def test_scan_reports_the_events_airflow_stranded(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    [truth] = ground_truth(version, "stranded_race")["expected_stranded"]
    code, doc = _scan(pg_templates.clone(version, "stranded_race"), capsys)
    [found] = doc["checks"]["stranded_events"]
    assert (found["dag_id"], found["event_ids"], found["run_id"]) == (
        truth["dag_id"],
        truth["event_ids"],
        truth["stranding_run_id"],
    )
    assert found["key"] == f"stranded_events|{truth['dag_id']}|{truth['stranding_run_id']}"
    assert (found["confidence"], found["severity"]) == ("confirmed", "error")
    assert doc["summary"]["checks"]["stranded_events"] == 1 and doc["groups"] == []
    assert code == 1


def test_without_select_on_log_the_set_is_a_warning(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """The pause records unread: whether the DAG was paused at its events is unknown, so no error page."""
    url = pg_templates.clone("3.1.2", "stranded_race")
    dbname = make_url(url).database
    role = f"dg_log_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{role}" LOGIN')
    try:
        execute_admin(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"', dbname=dbname)
        execute_admin(f'REVOKE SELECT ON log FROM "{role}"', dbname=dbname)
        as_role = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
        _, doc = _scan(as_role, capsys)
        [found] = doc["checks"]["stranded_events"]
        assert (found["confidence"], found["severity"]) == ("suspected", "warning")
        execute_admin(f'GRANT SELECT ON log TO "{role}"', dbname=dbname)
        _, doc = _scan(as_role, capsys)
        [found] = doc["checks"]["stranded_events"]
        assert (found["confidence"], found["severity"]) == ("confirmed", "error")
    finally:
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)
        execute_admin(f'DROP ROLE IF EXISTS "{role}"')


def test_scan_of_a_look_alike_reports_nothing_and_the_check_can_be_switched_off(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, doc = _scan(pg_templates.clone("3.1.2", "stranded_paused"), capsys)
    assert (code, doc["checks"].get("stranded_events", [])) == (0, [])
    monkeypatch.setenv("DUPGUARD_DISABLED_CHECKS", "stranded_events")
    code, doc = _scan(pg_templates.clone("3.1.2", "stranded_race"), capsys)
    assert "stranded_events" not in doc["checks"] and code == 0


def test_run_alerts_the_stranded_set_once(pg_templates: Templates) -> None:
    """`run --once` twice with one ledger: one alert for the (DAG, stranding run), nothing remediated."""
    url = pg_templates.clone("3.2.2", "stranded_race")
    [truth] = ground_truth("3.2.2", "stranded_race")["expected_stranded"]
    ledger, metrics, recorder = MemoryLedger(), Metrics(), SplitRecorder()
    first = _daemon(url, recorder, ledger, metrics)
    assert first.run(once=True) == 0
    assert _daemon(url, recorder, ledger, metrics).run(once=True) == 0
    [notice] = [n for n in recorder.notices if n.kind == "stranded_events"]
    assert notice.payload["type"] == "stranded_events" and notice.alertname == "DupguardStrandedEvents"
    assert notice.payload["observation"]["event_ids"] == truth["event_ids"]
    assert truth["dag_id"] in notice.text and all(f"event {e} " in notice.text for e in truth["event_ids"])
    assert first.parts.remediator.actions == []  # type: ignore[attr-defined]
    assert metrics.registry.get_sample_value("dupguard_check_detected_total", {"kind": "stranded_events"}) == 1
    assert datetime.now(UTC) >= notice.observation.seen_at

"""A custom trigger's own message id (``message_id_paths``) on databases Airflow's own code made: the
trigger_event_custom_id scenario (scripts/airflow/scenarios_trigger_event.py), a watcher whose payload
keeps the message's id at ``meta.id``, run by both triggerers up to 3.2.1. With the setting naming that
path, its copies are proven like SQS's: a confirmed group (the daemon stops its extra run:
tests/integration/test_trigger_event.py); without it, nothing.

Truth: ``expected_groups_with_message_id_paths`` (what Airflow recorded: which message each event
carried, as delivered, and which run consumed it) and ``message_id_paths`` (the setting's value)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.app.cli import main
from detector.core.model import Kind
from detector.metadb import dag_runs
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.settings import message_id_paths
from detector.sources.database.poll import IncrementalDetector, NewRowTracker
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

SCENARIO = "trigger_event_custom_id"
AFFECTED = ["3.0.6", "3.1.2"]
VERSIONS = [v for v in ("3.0.6", "3.1.2", "3.2.2", "3.3.2") if SCENARIO in scenarios(v)]
LONG_AGO = timedelta(days=3650)


def _truth(version: str) -> list[tuple[str, str, list[str], list[int]]]:
    return sorted(
        (g["confidence"], g["first_run_id"], g["extra_run_ids"], g["shared_event_ids"])
        for g in ground_truth(version, SCENARIO)["expected_groups_with_message_id_paths"]
    )


def _setting(version: str) -> str:
    value = ground_truth(version, SCENARIO)["message_id_paths"]
    assert isinstance(value, str)
    return value


def test_airflow_made_the_copies_on_the_affected_versions_only() -> None:
    """The tests below can fail: one message, two events, two runs where every triggerer runs the trigger."""
    assert {"3.0.6", "3.1.2", "3.2.2"} <= set(VERSIONS)
    for version in VERSIONS:
        truth = ground_truth(version, SCENARIO)
        assert truth["expected_groups"] == [] and truth["suspected_groups"] == []  # nothing without the setting
        assert len(_truth(version)) == (1 if version in AFFECTED else 0), version


def _scan(url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    main(["scan", "--database-url", url, "--format", "json"])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


@pytest.mark.parametrize("version", VERSIONS)
def test_scan_proves_the_copies_by_the_named_id(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_templates.clone(version, SCENARIO)
    assert [g for g in _scan(url, capsys)["groups"] if g["kind"] == "trigger_event"] == []  # no setting: no proof
    monkeypatch.setenv("DUPGUARD_MESSAGE_ID_PATHS", _setting(version))
    doc = _scan(url, capsys)
    found = sorted(
        (g["confidence"], g["kept_run_id"], g["duplicate_run_ids"], g["shared_event_ids"])
        for g in doc["groups"]
        if g["kind"] == "trigger_event"
    )
    assert found == _truth(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_poll_path_proves_them_too(version: str, pg_templates: Templates) -> None:
    engine = make_engine(parse_url(pg_templates.clone(version, SCENARIO)))
    try:
        t = open_airflow_db(engine).tables
        detector = IncrementalDetector(
            tables=t, tracker=NewRowTracker(high=0), id_paths=message_id_paths(_setting(version))
        )
        with engine.connect() as conn:
            findings = detector.judge(conn, dag_runs.new_runs(conn, t, 0, [], 1000), datetime.now(UTC))
    finally:
        engine.dispose()
    found = sorted(
        (f.confidence.value, f.kept.run_id, [r.run_id for r in f.duplicates], list(f.shared_event_ids))
        for f in findings
        if f.kind is Kind.TRIGGER_EVENT
    )
    assert found == _truth(version)

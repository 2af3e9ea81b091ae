"""The trigger_event kind on databases where Airflow's own code made the copies (the
consequence): scripts/airflow/scenarios_trigger_event.py; the truth is which message each event
carried (as delivered) and which run consumed it, never dupguard's rule."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.app.cli import main
from detector.core.model import Kind
from detector.core.ports import Result
from detector.metadb import dag_runs
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.settings import message_id_paths
from detector.sources.database.poll import IncrementalDetector, NewRowTracker
from tests.airflow_server import db_state
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

AFFECTED, FIXED = ["3.0.6", "3.1.2"], "3.2.2"
CASES = [(v, s) for v in [*AFFECTED, FIXED] for s in scenarios(v) if s.startswith("trigger_event_")]
LONG_AGO = timedelta(days=3650)  # the look-back reaches the Airflow-made scenario's runs


def _groups(truth: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...], list[int]]]:
    return sorted(
        (g["confidence"], g["first_run_id"], tuple(sorted(g["run_ids"])), sorted(g["shared_event_ids"]))
        for g in truth["expected_groups"]  # its suspected_groups are equal payloads: they link no runs
        if g["kind"] == "trigger_event"
    )


def test_every_affected_version_has_the_race_and_the_fixed_one_is_clean() -> None:
    for version in AFFECTED:
        assert [g["kind"] for g in ground_truth(version, "trigger_event_two_runs")["expected_groups"]] == [
            "trigger_event"
        ]
    clean = ground_truth(FIXED, "trigger_event_two_runs")
    assert clean["expected_groups"] == [] and clean["ids_for_triggerer"]["triggerer-b"] == []
    look_alikes = {"trigger_event_distinct_ids", "trigger_event_manual", "trigger_event_no_id", "trigger_event_one_run"}
    assert look_alikes <= set(scenarios("3.1.2"))


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_the_poll_path_finds_exactly_the_runs_airflow_made_from_one_message(
    version: str, scenario: str, pg_templates: Templates
) -> None:
    """The daemon's judge over every run of the fixture: the trigger_event groups are the truth's."""
    engine = make_engine(parse_url(pg_templates.clone(version, scenario)))
    try:
        t = open_airflow_db(engine).tables
        detector = IncrementalDetector(tables=t, tracker=NewRowTracker(high=0))
        with engine.connect() as conn:
            runs = dag_runs.new_runs(conn, t, 0, [], 1000)
            findings = detector.judge(conn, runs, datetime.now(UTC))
    finally:
        engine.dispose()
    found = sorted(
        (f.confidence.value, f.kept.run_id, tuple(sorted(r.run_id for r in f.runs)), list(f.shared_event_ids))
        for f in findings
        if f.kind is Kind.TRIGGER_EVENT
    )
    assert found == _groups(ground_truth(version, scenario))
    assert [f for f in findings if f.kind is not Kind.TRIGGER_EVENT] == []


def _scan(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--database-url", url, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def test_scan_reports_the_kind_in_its_json(pg_templates: Templates, capsys: pytest.CaptureFixture[str]) -> None:
    truth = ground_truth("3.1.2", "trigger_event_two_runs")
    [expected] = truth["expected_groups"]
    code, doc = _scan(pg_templates.clone("3.1.2", "trigger_event_two_runs"), capsys)
    [group] = doc["groups"]
    assert code == 1
    assert (group["kind"], group["confidence"]) == ("trigger_event", "confirmed")
    assert group["kept_run_id"] == expected["first_run_id"]
    assert group["duplicate_run_ids"] == [r for r in expected["run_ids"] if r != expected["first_run_id"]]
    assert group["shared_event_ids"] == expected["shared_event_ids"]
    for look_alike in ("trigger_event_distinct_ids", "trigger_event_manual", "trigger_event_no_id"):
        _, doc = _scan(pg_templates.clone("3.1.2", look_alike), capsys)  # exit 1: trigger_flapping's exposure
        assert doc["groups"] == [], look_alike


# An SQS MessageId, and a custom watcher's own id at meta.id named by message_id_paths: the same rules.
DAEMON_CASES = [(v, s) for v in AFFECTED for s in ("trigger_event_two_runs", "trigger_event_custom_id")]


@pytest.mark.parametrize(("version", "scenario"), DAEMON_CASES, ids=[f"{v}-{s}" for v, s in DAEMON_CASES])
def test_the_daemon_stops_the_extra_run_in_the_db_backend_and_alerts_once(
    version: str, scenario: str, pg_templates: Templates, daemons: list[Running]
) -> None:
    """remediation=fail, backend db: the run the second copy made is failed with dupguard's note; the
    run of the first copy, and everything else, is untouched; one detection alert."""
    url = pg_templates.clone(version, scenario)
    truth = ground_truth(version, scenario)
    [group] = truth.get("expected_groups_with_message_id_paths", truth["expected_groups"])
    kept = group["first_run_id"]
    [dup] = [r for r in group["run_ids"] if r != kept]
    before = db_state(url)
    d = start_daemon(
        url,
        real_remediation=True,
        durable=False,
        takeover_wait=timedelta(0),
        # a lease of 3 s, not the harness's 0.6 s: under CI load a 0.6 s stall fenced the write (rolled
        # back, retried: [failed, done]), right but test_fencing's subject, not this test's
        leader_check_interval=timedelta(seconds=1),
        remediation="fail",
        remediation_backend="db",
        startup_lookback=LONG_AGO,
        message_id_paths=message_id_paths(truth.get("message_id_paths", "")),
    )
    daemons.append(d)
    wait_for(lambda: dup in d.alerter.results(), what="the duplicate's outcome")
    time.sleep(0.3)  # later polls must not alert or act again
    assert d.alerter.results()[dup] == [Result.DONE]
    [detected] = d.alerter.detected()
    assert detected.finding.kind is Kind.TRIGGER_EVENT and detected.finding.kept.run_id == kept
    after = db_state(url)
    assert after[dup].state == "failed" and after[dup].note
    assert after[kept] == before[kept]

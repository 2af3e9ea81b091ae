"""The trigger_flapping check plugged in: its class on Airflow-made dumps, `dupguard scan --format json`,
and the runner the daemon schedules (alerted once per trigger, on Slack and the webhook).

The dumps are the database after each triggerer loop (tests/fixtures/scenarios/<ver>/triggers/).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from detector.app.cli import main
from detector.app.daemon import Daemon, Parts
from detector.app.leader import AlwaysLeader
from detector.app.ledger import MemoryLedger
from detector.app.wiring import build_alerter
from detector.checks import enabled as checks
from detector.checks.runner import CheckRunner
from detector.checks.trigger_flapping.check import KIND, TriggerFlappingCheck
from detector.config import Config
from detector.core.checks import CheckContext
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import RecordingAlerter, RecordingRemediator, wait_for
from tests.pg import Templates
from tests.slack_server import SlackServer
from tests.unit.test_trigger_flapping import CASES, _truth

pytestmark = pytest.mark.integration


def _collect(check: TriggerFlappingCheck, url: str, db_now: datetime, *, live: bool = True) -> list[Any]:
    db = open_airflow_db(make_engine(parse_url(url)))
    try:
        with db.engine.connect() as conn:
            return check.collect(conn, db, CheckContext(db_now=db_now, now=datetime.now(UTC), live=live))
    finally:
        db.engine.dispose()


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_the_check_remembers_owners_between_runs_and_reports_each_flap(
    version: str, scenario: str, pg_templates: Templates
) -> None:
    """One instance run after every loop: one observation per flap Airflow made, keyed per trigger."""
    truth = _truth(version, scenario)
    threshold = timedelta(seconds=truth["health_check_threshold_seconds"])
    check = TriggerFlappingCheck(Config.of(triggerer_health_check_threshold=threshold), Metrics())
    found = []
    for i, sample in enumerate(truth["samples"]):
        url = pg_templates.clone(version, sample["fixture"])
        found += [(i, o) for o in _collect(check, url, datetime.fromisoformat(sample["db_now"]))]
    assert [(i, o.facts["trigger_id"]) for i, o in found] == [
        (f["sample"], f["trigger_id"]) for f in truth["expected_flapping"]
    ]
    for i, obs in found:
        flap = next(f for f in truth["expected_flapping"] if f["sample"] == i)
        assert (obs.confidence, obs.severity, obs.kind) == ("confirmed", "error", KIND)
        assert (obs.facts["previous_owner"]["job_id"], obs.facts["new_owner"]["job_id"]) == (
            flap["from_job"],
            flap["to_job"],
        )
        assert obs.dag_ids == (tuple(truth["consumer_dag_ids"]) or ("late_report",))
    assert len({o.key for _, o in found}) <= 1  # every flap of the one trigger: one key, one alert


def _scan(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--database-url", url, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("version", "scenario", "severity"),
    [
        ("3.1.2", "flip_asset", "warning"),
        ("3.1.2", "flip_callback", "warning"),
        ("3.2.2", "flip_asset", "info"),
        ("3.2.2", "flip_callback", "warning"),
        ("3.3.2", "flip_callback", "warning"),
    ],
)
def test_scan_reports_the_exposure_and_says_it_is_one(
    version: str, scenario: str, severity: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    truth = _truth(version, scenario)
    _, doc = _scan(pg_templates.clone(version, truth["samples"][-1]["fixture"]), capsys)
    [entry] = doc["checks"][KIND]
    assert (entry["confidence"], entry["severity"]) == ("exposure", severity)
    assert entry["trigger_id"] == truth["samples"][-1]["triggers"][0]["id"]
    assert entry["dag_ids"] == (truth["consumer_dag_ids"] or ["late_report"])
    assert {j["hostname"] for j in entry["triggerer_jobs"]} == {"triggerer-a", "triggerer-b"}
    assert any("dupguard run" in line for line in entry["lines"])  # a scan cannot see owner changes


def test_scan_of_a_fixed_release_with_asset_triggers_only_reports_nothing(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """3.3.2 filters asset triggers (the clean fixture): no exposure."""
    _, doc = _scan(pg_templates.clone("3.3.2", "triggers/flip_asset.2"), capsys)
    assert doc["checks"][KIND] == []


@pytest.fixture
def server() -> Iterator[SlackServer]:
    s = SlackServer()
    yield s
    s.stop()


def _airflow_loop(url: str, owner: int) -> None:
    """What two live triggerers keep writing between two looks: both heartbeat (now, on the database's
    clock: the dump's timestamps are from when it was made) and the loop's claimer owns the trigger,
    as the 3.1.2 fixture's Airflow loops did (triggerer_id 1, then 2, then 1)."""
    engine = make_engine(parse_url(url))
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET latest_heartbeat = now() WHERE job_type = 'TriggererJob'"))
        conn.execute(text("UPDATE trigger SET triggerer_id = :owner"), {"owner": owner})
    engine.dispose()


def test_the_runner_alerts_one_flapping_trigger_once_on_slack_and_the_webhook(
    pg_templates: Templates, server: SlackServer
) -> None:
    """The runner the daemon schedules, over three loops (a, b, a): two flaps, one alert per channel."""
    url = pg_templates.clone("3.1.2", "triggers/flip_asset.0")
    config = Config.of(
        database_url=url,
        slack_bot_token=server.token,
        slack_channel="#dup-alerts",
        slack_api_url=server.api_url,
        webhook_url=server.generic_url,
        alert_timeout=timedelta(seconds=2),
    )
    ledger, metrics = MemoryLedger(), Metrics()
    alerter = build_alerter(config, ledger, metrics)
    db = open_airflow_db(make_engine(parse_url(url)))
    runner = CheckRunner(db, checks.build(config, db, metrics), ledger, alerter, metrics, cluster="prod-eu")
    seen = []
    for owner in (1, 2, 1):
        _airflow_loop(url, owner)
        seen.append(len(runner.run(KIND, datetime.now(UTC))))
    assert seen == [0, 1, 1]
    alerter.close(5.0)
    assert server.wait_for(lambda: len(server.generic_payloads) >= 1 and len(server.messages) >= 1)
    assert len(server.top_level()) == 1 and len(server.generic_payloads) == 1
    assert "orders_consumer" in server.top_level()[0].text
    assert metrics.registry.get_sample_value("dupguard_check_detected_total", {"kind": KIND}) == 1
    db.engine.dispose()


class _Notices:
    def __init__(self) -> None:
        self.notices: list[Any] = []

    def notify_notice(self, notice: Any) -> None:
        self.notices.append(notice)


@dataclass
class DaemonRun:
    """What a daemon run through the triggerers' loops did: the checks' notices, the group alerts,
    what it remediated and its metrics."""

    notices: list[Any]
    alerter: RecordingAlerter
    remediator: RecordingRemediator
    metrics: Metrics


def run_daemon_through(url: str, owners: Iterable[int], **settings: Any) -> DaemonRun:
    """`dupguard run` (the daemon's one scheduler, the check every 0.2 s here) while the triggerers'
    loops give the trigger to each of ``owners`` in turn, two whole looks after each loop."""
    config = Config.of(
        database_url=url,
        http_port=0,
        poll_interval=timedelta(milliseconds=50),
        trigger_flapping_interval=timedelta(milliseconds=200),
        **settings,
    )
    ledger, metrics, notices = MemoryLedger(), Metrics(), _Notices()
    db = open_airflow_db(make_engine(parse_url(url)))
    done = DaemonRun(notices.notices, RecordingAlerter(), RecordingRemediator(), metrics)
    parts = Parts(
        source=DatabaseSource(config, db, ledger, metrics),
        leadership=AlwaysLeader(),
        ledger=ledger,
        remediator=done.remediator,
        alerter=done.alerter,
        metrics=metrics,
        checks=CheckRunner(db, checks.build(config, db, metrics), ledger, notices, metrics, cluster="prod-eu"),
    )
    daemon = Daemon(config, parts)
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()

    def looks() -> float:
        return metrics.registry.get_sample_value("dupguard_check_duration_seconds_count", {"kind": KIND}) or 0.0

    try:
        for owner in owners:
            _airflow_loop(url, owner)
            before = looks()
            wait_for(lambda b=before: looks() >= b + 2, what="two looks after the loop")  # a whole look after it
    finally:
        daemon.shutdown(timeout=1.0)
        thread.join(timeout=10)
        db.engine.dispose()
    return done


def test_the_daemon_alerts_a_flapping_trigger_once(pg_templates: Templates) -> None:
    """`dupguard run`: owners 1, 2, 1, 2 with both triggerers heartbeating -> one notice, the trigger's
    consumer DAGs in it; nothing remediated."""
    done = run_daemon_through(pg_templates.clone("3.1.2", "triggers/flip_asset.0"), (1, 2, 1, 2))
    [notice] = done.notices
    assert "orders_consumer" in json.dumps(notice.payload, default=str)
    assert done.remediator.actions == []
    assert done.metrics.registry.get_sample_value("dupguard_check_detected_total", {"kind": KIND}) == 1

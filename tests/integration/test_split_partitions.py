"""Split partition keys (apache/airflow#71070) and partition re-processing, on databases made by
Airflow 3.3.2's and 3.2.2's own code (tests/fixtures/scenarios, scripts/airflow/scenarios_partitioned.py).

Ground truth is what Airflow recorded there: the ``asset_partition_dag_run`` rows, their events
and the runs each row made (``notes.apdr`` of each scenario), never dupguard's own rule.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.app.cli import main
from detector.app.daemon import Daemon, Parts
from detector.app.leader import AlwaysLeader
from detector.app.ledger import MemoryLedger
from detector.app.wiring import build_alerter
from detector.checks import enabled as checks
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import RecordingAlerter, RecordingRemediator
from tests.pg import Templates, ground_truth
from tests.slack_server import SlackServer

pytestmark = pytest.mark.integration


def _scan(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any]]:
    code = main(["scan", "--database-url", url, "--format", "json", *extra])
    return code, json.loads(capsys.readouterr().out)


def _pending_split(truth: dict[str, Any]) -> dict[str, Any]:
    rows = truth["notes"]["apdr"]
    keys = {(r["target_dag_id"], r["partition_key"]) for r in rows}
    assert len(keys) == 1 and all(r["created_dag_run_id"] is None for r in rows)  # what Airflow left behind
    [(dag_id, key)] = keys
    return {"dag_id": dag_id, "partition_key": key, "rows": {r["id"]: r["event_ids"] for r in rows}}


@pytest.mark.parametrize("version", ["3.2.2", "3.3.2"])
def test_split_and_consumer_is_reported_as_a_split_partition(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """Consumer on a1 & a2: two pending rows, one event each, no run -> one split_partition, exit 1."""
    truth = ground_truth(version, "split_and")
    expected = _pending_split(truth)
    code, doc = _scan(pg_templates.clone(version, "split_and"), capsys, "--split-grace", "1s")  # any fixture age
    assert code == 1
    assert doc["groups"] == [] and doc["summary"]["groups"] == 0
    assert doc["summary"]["split_partitions"] == 1
    [split] = doc["split_partitions"]
    assert (split["kind"], split["dag_id"], split["partition_key"]) == (
        "split_partition",
        expected["dag_id"],
        expected["partition_key"],
    )
    assert {r["id"]: r["event_ids"] for r in split["rows"]} == expected["rows"]
    assert split["waiting"] is True and all(r["pending"] for r in split["rows"])
    assert split["stuck_row_ids"] == [min(expected["rows"])]
    assert all(r["age_seconds"] > 0 for r in split["rows"])


def test_a_split_younger_than_the_grace_period_is_not_reported(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grace period counts from the second row's creation (an OR consumer resolves in milliseconds)."""
    code, doc = _scan(pg_templates.clone("3.3.2", "split_and"), capsys, "--split-grace", "3650d")
    assert code == 0 and doc["split_partitions"] == []


@pytest.mark.parametrize("version", ["3.2.2", "3.3.2"])
def test_split_or_consumer_runs_are_one_confirmed_group_and_no_split_remains(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """Consumer on a1 | a2: each split row made its own run of the key -> a duplicate group."""
    truth = ground_truth(version, "split_or")
    rows = truth["notes"]["apdr"]
    made = sorted(r["created_dag_run_id"] for r in rows)
    runs = {r["id"]: r["run_id"] for r in truth["runs"]}
    code, doc = _scan(pg_templates.clone(version, "split_or"), capsys)
    assert code == 1 and doc["split_partitions"] == []
    [group] = doc["groups"]
    assert (group["kind"], group["confidence"]) == ("partitioned", "confirmed")
    assert sorted([group["kept_run_id"], *group["duplicate_run_ids"]]) == sorted(runs[i] for i in made)
    assert group["kept_run_id"] == runs[made[0]]


@pytest.mark.parametrize("version", ["3.2.2", "3.3.2"])
def test_legitimate_reprocessing_of_a_key_is_not_reported(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key re-processed 2 s later (its second row created after the first run): no group, exit 0."""
    truth = ground_truth(version, "partition_rerun")
    assert truth["notes"]["legitimate_reprocessing"]["seconds_between_runs"] < 60  # inside the suspect window
    code, doc = _scan(pg_templates.clone(version, "partition_rerun"), capsys)
    assert (code, doc["groups"], doc["split_partitions"]) == (0, [], [])


class SplitRecorder:
    def __init__(self) -> None:
        self.notices: list[Any] = []

    def notify_notice(self, notice: Any) -> None:
        self.notices.append(notice)


def _daemon(url: str, splits_alerter: Any, ledger: MemoryLedger, metrics: Metrics) -> Daemon:
    config = Config.of(database_url=url, http_port=0, startup_lookback=timedelta(days=3650))
    db = open_airflow_db(make_engine(parse_url(url)))
    parts = Parts(
        source=DatabaseSource(config, db, ledger, metrics),
        leadership=AlwaysLeader(),
        ledger=ledger,
        remediator=RecordingRemediator(),
        alerter=RecordingAlerter(),
        metrics=metrics,
        checks=CheckRunner(db, checks.build(config, db, metrics), ledger, splits_alerter, metrics, cluster="prod-eu"),
    )
    return Daemon(config, parts)


def test_run_alerts_a_split_once_and_never_remediates(pg_templates: Templates) -> None:
    """`run --once` twice with one ledger: the split is alerted once; no remediation is planned for it."""
    url = pg_templates.clone("3.3.2", "split_and")
    expected = _pending_split(ground_truth("3.3.2", "split_and"))
    ledger, metrics, recorder = MemoryLedger(), Metrics(), SplitRecorder()
    first = _daemon(url, recorder, ledger, metrics)
    assert first.run(once=True) == 0
    assert _daemon(url, recorder, ledger, metrics).run(once=True) == 0
    [notice] = recorder.notices
    assert notice.payload["type"] == "split_partition"
    assert notice.payload["split"]["dag_id"] == expected["dag_id"]
    assert {r["id"]: r["event_ids"] for r in notice.payload["split"]["rows"]} == expected["rows"]
    assert first.parts.remediator.actions == []  # type: ignore[attr-defined]
    assert metrics.registry.get_sample_value("dupguard_check_detected_total", {"kind": "split_partition"}) == 1
    assert metrics.registry.get_sample_value("dupguard_check_observations", {"kind": "split_partition"}) == 1


@pytest.fixture
def server() -> Iterator[SlackServer]:
    s = SlackServer()
    yield s
    s.stop()


def test_split_alert_reaches_slack_and_the_webhook_once(pg_templates: Templates, server: SlackServer) -> None:
    """Through the real alert path (Dispatcher): one Slack message and one webhook payload per split."""
    url = pg_templates.clone("3.3.2", "split_and")
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
    watch = CheckRunner(db, checks.build(config, db, metrics), ledger, alerter, metrics, cluster="prod-eu")
    now = datetime.now(UTC)
    assert len(watch.run("split_partition", now)) == 1
    assert len(watch.run("split_partition", now + timedelta(seconds=10))) == 1  # still split, not alerted again
    alerter.close(5.0)
    assert server.wait_for(lambda: len(server.generic_payloads) >= 1 and len(server.messages) >= 1)
    assert len(server.top_level()) == 1 and len(server.generic_payloads) == 1
    assert server.rejected == []
    payload = server.generic_payloads[0]
    assert (payload["schema"], payload["type"]) == ("dupguard.alert/v1", "split_partition")
    assert payload["severity"] == "error" and payload["dedup_key"] == payload["split"]["key"]
    assert "consume_sales_eu_and_us" in server.top_level()[0].text


@pytest.mark.parametrize(
    ("scenario", "confidences"),
    [("split_or", ["confirmed"]), ("partition_rerun", [])],
    ids=["split_or", "partition_rerun"],
)
def test_run_judges_partitioned_runs_by_their_rows(
    pg_templates: Templates, scenario: str, confidences: list[str]
) -> None:
    """The daemon's incremental path: the split's two runs are a confirmed group; a re-processing pages no one."""
    url = pg_templates.clone("3.3.2", scenario)
    truth = ground_truth("3.3.2", scenario)
    ledger, metrics, recorder = MemoryLedger(), Metrics(), SplitRecorder()
    daemon = _daemon(url, recorder, ledger, metrics)
    assert daemon.run(once=True) == 0
    alerted = daemon.parts.alerter.detected()  # type: ignore[attr-defined]
    assert [e.finding.confidence.value for e in alerted] == confidences
    for event in alerted:
        assert sorted(r.run_id for r in event.finding.runs) == sorted(truth["expected_groups"][0]["run_ids"])
    assert recorder.notices == []  # every split row made its run: no split left

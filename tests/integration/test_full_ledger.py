"""A ledger that cannot record, the durable one: its server can read but not write (a full volume), on a real
PostgreSQL with the real Airflow 3.1.2 schema.

A full volume on the shared test server would break every other test using it, so the ledger's own
tables refuse writes the way PostgreSQL does on a full disk: a trigger raising SQLSTATE 53100
(disk_full) with the server's message, on every INSERT and UPDATE of schema ``dupguard``. Reads still
work, as they do on a full volume. (The state file's real full tmpfs is in test_api_source.py.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.app.ledger import DbLedger, init_db
from detector.checks import enabled as checks
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.core.ports import AlertKind
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.integration.test_split_partitions import SplitRecorder
from tests.pg import Templates, execute_admin, ground_truth
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
FULL = 'could not extend file "base/16384/24576": No space left on device'
TABLES = ("claims", "notes", "state")


def _fill(dbname: str) -> None:
    execute_admin(
        "CREATE FUNCTION dupguard.disk_full() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{FULL}' USING ERRCODE = 'disk_full'; END $$",
        dbname=dbname,
    )
    for table in TABLES:
        execute_admin(
            f"CREATE TRIGGER disk_full BEFORE INSERT OR UPDATE ON dupguard.{table} "
            "FOR EACH ROW EXECUTE FUNCTION dupguard.disk_full()",
            dbname=dbname,
        )


def _free(dbname: str) -> None:
    execute_admin("DROP FUNCTION dupguard.disk_full() CASCADE", dbname=dbname)


def _polls_failed(d: Running) -> float:
    return d.metrics.registry.get_sample_value("dupguard_poll_errors_total") or 0.0


def test_a_full_durable_ledger_alerts_at_once_and_remediates_once_it_can_record(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """A duplicate appears while the durable ledger cannot write: it is alerted at once, once, saying
    it may repeat and naming the cause; nothing is remediated while its claim cannot be recorded;
    /readyz is red naming the cause. Once the ledger writes again the duplicate is stopped (once) and
    not alerted again."""
    url = pg_templates.clone("3.1.2")
    dbname = str(make_url(url).database)
    d = start_daemon(url, durable=True, remediation="fail", takeover_wait=timedelta(0))
    daemons.append(d)
    wait_for(d.is_leader, what="the only replica to lead")
    _fill(dbname)
    writer = AirflowWriter(url)
    try:
        kept, duplicate = writer.duplicate_pair("consumer", gap=timedelta(0))
        wait_for(lambda: d.alerter.detected(), timeout=30, what="the alert while the ledger is full")
        failed = _polls_failed(d)
        wait_for(lambda: _polls_failed(d) >= failed + 3, timeout=60, what="the poll failing and retried")
        up, reason = d.daemon.ready()
        assert not up and "No space left on device" in reason, reason
        [alert] = d.alerter.events
        assert alert.kind is AlertKind.DETECTED and {r.run_id for r in alert.finding.duplicates} == {duplicate.run_id}
        assert alert.unrecorded is not None and "No space left on device" in alert.unrecorded, alert.unrecorded
        assert d.remediator.actions == []
        _free(dbname)
        wait_for(lambda: d.remediator.actions, timeout=60, what="the remediation once the ledger records")
        wait_for(lambda: d.daemon.ready()[0], timeout=30, what="/readyz green again")
        polls = d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0
        wait_for(
            lambda: (d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0) >= polls + 5,
            what="later passes",
        )
    finally:
        writer.close()
    assert [a.run.run_id for a in d.remediator.actions] == [duplicate.run_id]
    assert [e.kind for e in d.alerter.events if e.kind is AlertKind.DETECTED] == [AlertKind.DETECTED]
    assert kept.run_id not in {a.run.run_id for a in d.remediator.actions}


def test_a_full_durable_ledger_does_not_hold_back_a_periodic_checks_alert(pg_templates: Templates) -> None:
    """The stranded_events check on Airflow-made stranded events (3.2.2 stranded_race) while the
    durable ledger cannot write: its notice is sent at once, once per process (a second run while
    full sends nothing more), each failing run logs ledger_claim_failed naming the cause and counts
    a check failure (its repair step waits); once the ledger writes, the claim is recorded, the
    notice not sent again, and the repair step runs. It was held back: the failing claim failed the whole run."""
    url = pg_templates.clone("3.2.2", "stranded_race")
    [truth] = ground_truth("3.2.2", "stranded_race")["expected_stranded"]
    engine = make_engine(parse_url(url))
    init_db(engine)
    config = Config.of(database_url=url)
    db, metrics, recorder = open_airflow_db(engine), Metrics(), SplitRecorder()
    runner = CheckRunner(db, checks.build(config, db, metrics), DbLedger(engine), recorder, metrics, cluster="prod-eu")
    _fill(str(make_url(url).database))
    try:
        with capture_logs() as logs:
            assert not runner.run_reported("stranded_events", datetime.now(UTC))
            assert not runner.run_reported("stranded_events", datetime.now(UTC))
    finally:
        _free(str(make_url(url).database))
    [notice] = recorder.notices
    assert notice.kind == "stranded_events" and notice.payload["observation"]["event_ids"] == truth["event_ids"]
    claims = [e for e in logs if e["event"] == "ledger_claim_failed"]
    assert len(claims) == 1 and "No space left on device" in claims[0]["error"], claims
    failures = [e for e in logs if e["event"] == "check_failed"]
    assert len(failures) == 2 and all("No space left on device" in e["error"] for e in failures), failures
    assert metrics.registry.get_sample_value("dupguard_check_failures_total", {"kind": "stranded_events"}) == 2
    assert runner.run_reported("stranded_events", datetime.now(UTC))
    # the notice not again; the repair step (dry-run by default) ran only now, once the ledger writes
    assert [n.kind for n in recorder.notices] == ["stranded_events", "stranded_repair"]
    assert not DbLedger(engine).claim(notice.key, "detected")  # recorded: another process will not send it
    engine.dispose()

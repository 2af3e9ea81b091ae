"""Issue 23 §3 with the durable ledger: its server can read but not write (a full volume), on a real
PostgreSQL with the real Airflow 3.1.2 schema.

A full volume on the shared test server would break every other test using it, so the ledger's own
tables refuse writes the way PostgreSQL does on a full disk: a trigger raising SQLSTATE 53100
(disk_full) with the server's message, on every INSERT and UPDATE of schema ``dupguard``. Reads still
work, as they do on a full volume. (The state file's real full tmpfs is in test_api_source.py.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.engine import make_url

from detector.core.ports import AlertKind
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, execute_admin
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

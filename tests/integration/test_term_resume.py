"""A new leader term resumes where this process stopped judging, on a real PostgreSQL
with the real Airflow 3.1.2 schema and the deploy guide's read-only role (the in-memory ledger).

A term ends the way the issue tells it: dupguard's role cannot connect any more (its connection limit
is 0, as when the slots are exhausted, and its sessions are ended) while the "scheduler" (the test's
admin connection) keeps committing runs. Truth is the rows the test wrote. Before the fix a term
started ``--startup-lookback`` behind the newest run: a gap longer than that lost its duplicates
silently, and a short gap cost a fixed re-scan of the runs judged before it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg2
import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.sources.database import resume
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.integration.test_grants import documented_grants
from tests.pg import ROOT, Templates, execute_admin
from tests.writer import AirflowWriter, Committed

pytestmark = pytest.mark.integration
LOOKBACK = timedelta(minutes=15)


@dataclass
class Rig:
    url: str  # the admin's: the scheduler's writes
    role: str
    role_url: str  # dupguard's: the documented read-only grants
    writer: AirflowWriter
    fetches: list[tuple[int, int]] = field(default_factory=list)  # (above, rows) of each tail fetch

    def admin(self, sql: str, *params: Any) -> None:
        conn = psycopg2.connect(self.url)
        conn.autocommit = True
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
        finally:
            conn.close()

    def cut_off(self, d: Running) -> None:
        """dupguard's role can no longer connect, and its sessions end: its term ends."""
        execute_admin(f'ALTER ROLE "{self.role}" CONNECTION LIMIT 0')
        self.admin("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", self.role)
        wait_for(lambda: not d.is_leader() and not d.daemon.parts.source.watching, what="the term to end")

    def reconnect(self) -> None:
        self.fetches.clear()
        execute_admin(f'ALTER ROLE "{self.role}" CONNECTION LIMIT -1')

    def age(self, minutes: int) -> None:
        """Every run so far was queued ``minutes`` earlier: the outage lasted longer than that."""
        self.admin(
            "UPDATE dag_run SET queued_at = queued_at - make_interval(mins => %s), "
            "run_after = run_after - make_interval(mins => %s)",
            minutes,
            minutes,
        )

    def count_fetches(self, d: Running) -> None:
        """Record the tail's fetches (``dag_runs.new_runs``): where each starts and how many rows it read."""
        source = d.daemon.parts.source
        assert isinstance(source, DatabaseSource)

        def after(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            if "WHERE dag_run.id >" in statement and isinstance(parameters, dict) and "above" in parameters:
                self.fetches.append((int(parameters["above"]), int(cursor.rowcount)))

        event.listen(source.db.engine, "after_cursor_execute", after)


@pytest.fixture
def rig(pg_templates: Templates) -> Iterator[Rig]:
    url = pg_templates.clone("3.1.2")
    dbname = make_url(url).database
    role = f"dg_term_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{role}" LOGIN')
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")["3.0 and 3.1"]
    execute_admin(grant.replace("TO dupguard;", f'TO "{role}";'), dbname=str(dbname))
    writer = AirflowWriter(url)
    role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    yield Rig(url, role, role_url, writer)
    writer.close()
    execute_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
    execute_admin(f'DROP OWNED BY "{role}"', dbname=str(dbname))
    execute_admin(f'DROP ROLE "{role}"')


def _duplicates(d: Running) -> set[str]:
    return {r.run_id for e in d.alerter.detected() for r in e.finding.duplicates}


def _judged(d: Running, top: int) -> None:
    """Wait until the passes that read up to ``top`` finished (a pass cut short is rewound)."""
    source = d.daemon.parts.source
    assert isinstance(source, DatabaseSource)
    wait_for(lambda: source.summary()["watermark"] == top, what=f"the runs up to {top} to be read")
    polls = d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0
    wait_for(
        lambda: (d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0) >= polls + 2,
        what="the pass that read them to finish",
    )


def _start(rig: Rig, daemons: list[Running], **overrides: Any) -> Running:
    d = start_daemon(rig.role_url, durable=False, startup_lookback=LOOKBACK, **overrides)
    daemons.append(d)
    wait_for(d.is_leader, what="the only replica to lead")
    return d


def test_an_outage_longer_than_the_lookback_loses_no_duplicate(rig: Rig, daemons: list[Running]) -> None:
    """Duplicates committed while dupguard could not connect, for longer than the look-back, are
    every one detected when it reconnects; nothing is reported as a gap (nothing was lost)."""
    before = rig.writer.duplicate_pair("before", gap=timedelta(0))[1]
    d = _start(rig, daemons)
    wait_for(lambda: _duplicates(d) == {before.run_id}, what="the pair committed before the outage")
    rig.cut_off(d)
    during: list[Committed] = []
    for i in range(6):
        rig.writer.ordinary(f"quiet_{i}")
        during.append(rig.writer.duplicate_pair(f"consumer_{i}", gap=timedelta(0))[1])
    rig.age(30)  # the outage began 30 minutes ago: twice the look-back
    last = rig.writer.duplicate_pair("recent", gap=timedelta(0))[1]  # within the look-back
    rig.reconnect()
    wait_for(d.is_leader, timeout=30, what="the term after the outage")
    wait_for(lambda: last.run_id in _duplicates(d), timeout=30, what="the newest duplicate")
    assert _duplicates(d) == {before.run_id, last.run_id, *(c.run_id for c in during)}
    assert d.metrics.registry.get_sample_value("dupguard_coverage_gaps_total") == 0


def test_a_term_change_reads_only_the_gap(rig: Rig, daemons: list[Running]) -> None:
    """The new term starts at the watermark the last one reached: its fetches read exactly the runs
    of the gap, not the look-back's runs judged before it."""
    for i in range(20):
        rig.writer.ordinary(f"history_{i}")
    d = _start(rig, daemons)
    rig.count_fetches(d)
    top = rig.writer.ordinary("last_before").id
    _judged(d, top)
    rig.cut_off(d)
    gap = [rig.writer.ordinary("gap_a"), *rig.writer.duplicate_pair("gap_pair", gap=timedelta(0))]
    rig.reconnect()
    wait_for(lambda: _duplicates(d) == {gap[-1].run_id}, timeout=30, what="the gap's duplicate")
    assert rig.fetches, "the new term fetched"
    assert rig.fetches[0][0] == top, "the first fetch starts at the watermark reached before the gap"
    assert sum(rows for _, rows in rig.fetches) == len(gap), rig.fetches


def test_a_standby_behind_a_live_leader_does_not_rejudge_its_term(rig: Rig, daemons: list[Running]) -> None:
    """With in-memory ledgers, a standby that watched a live leader judge runs starts its own term
    after them: the leader's groups are not alerted twice, the next one is alerted by the new leader."""
    a = _start(rig, daemons)
    b = start_daemon(rig.role_url, durable=False, startup_lookback=LOOKBACK)
    daemons.append(b)
    pairs = [rig.writer.duplicate_pair(f"consumer_{i}", gap=timedelta(0))[1] for i in range(3)]
    wait_for(lambda: _duplicates(a) == {p.run_id for p in pairs}, what="the leader's alerts")
    standby = b.daemon.parts.source
    assert isinstance(standby, DatabaseSource)
    wait_for(lambda: (standby.resume_point() or 0) >= pairs[-1].id, what="the standby to see the leader's progress")
    a.stop()
    wait_for(b.is_leader, timeout=20, what="takeover")
    after = rig.writer.duplicate_pair("after", gap=timedelta(0))[1]
    wait_for(lambda: after.run_id in _duplicates(b), timeout=20, what="the new leader's alert")
    assert _duplicates(b) == {after.run_id}, "the old leader's groups were not judged again"


def test_runs_deleted_before_they_were_judged_are_one_reported_gap(rig: Rig, daemons: list[Running]) -> None:
    """Rows removed during the outage (``airflow db clean``) cannot be judged: one warning naming the
    ids, one count, and the reason /readyz gives; the runs still there are judged."""
    rig.writer.ordinary("first")
    d = _start(rig, daemons)
    top = rig.writer.ordinary("judged").id
    _judged(d, top)
    rig.cut_off(d)
    lost = [rig.writer.ordinary(f"cleaned_{i}") for i in range(3)]
    rig.admin("DELETE FROM dag_run WHERE id <= %s", lost[-1].id)
    kept = rig.writer.duplicate_pair("kept", gap=timedelta(0))[1]
    with capture_logs() as logs:
        rig.reconnect()
        wait_for(lambda: kept.run_id in _duplicates(d), timeout=30, what="the duplicate still in the table")
    gaps = [e for e in logs if e["event"] == "coverage_gap"]
    assert len(gaps) == 1 and gaps[0]["log_level"] == "warning", gaps
    assert (gaps[0]["first_id"], gaps[0]["last_id"]) == (top + 1, lost[-1].id)
    assert d.metrics.registry.get_sample_value("dupguard_coverage_gaps_total") == 1
    d.daemon.check_leader()
    up, reason = d.daemon.ready()
    assert up and f"dag_run ids {top + 1}-{lost[-1].id}" in reason, reason


def test_a_gap_past_the_catch_up_limit_is_reported_and_the_rest_judged(
    rig: Rig, daemons: list[Running], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A term reads back at most ``CATCH_UP_LIMIT`` ids (here 10, in production 100,000): older runs
    are one reported gap, and every duplicate within the limit is detected."""
    monkeypatch.setattr(resume, "CATCH_UP_LIMIT", 10)
    d = _start(rig, daemons)
    top = rig.writer.ordinary("judged").id
    _judged(d, top)
    rig.cut_off(d)
    old = [rig.writer.ordinary(f"old_{i}") for i in range(12)]
    recent = rig.writer.duplicate_pair("recent", gap=timedelta(0))
    with capture_logs() as logs:
        rig.reconnect()
        wait_for(lambda: recent[1].run_id in _duplicates(d), timeout=30, what="the duplicate within the limit")
    [gap] = [e for e in logs if e["event"] == "coverage_gap"]
    newest = recent[1].id
    assert (gap["first_id"], gap["last_id"]) == (top + 1, newest - 10)
    assert old[0].id == top + 1 and d.metrics.registry.get_sample_value("dupguard_coverage_gaps_total") == 1

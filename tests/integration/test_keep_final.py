"""A keep decision is final: restarts, failovers, two replicas and a third run joining
never turn a kept run into a remediated one. Real PostgreSQL with the real 3.1.2 schema, the real
``db`` backend, and a real Airflow 3.1.2 API server for the ``api`` backend.

The trap: stopping a duplicate whose task was just starting leaves a *failed* task instance (Airflow's
``set_dag_run_state_to_failed`` fails running tasks), and ``failed`` counts as started. A judgement
that forgot the first one would keep the stopped run and stop the kept one: both die.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.core.plan import Action
from detector.core.ports import RemediationResult, Remediator, Result
from tests.airflow_server import AirflowServer, CountingProxy, ServerPool, db_state, sql
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, ground_truth
from tests.writer import AirflowWriter, Committed

pytestmark = pytest.mark.integration

FANOUT = "race_asset_fanout"
LONG_AGO = timedelta(days=3650)  # the look-back reaches the Airflow-made scenario's runs


def _start(daemons: list[Running], url: str, *, task_starts: str | None = None, **settings: Any) -> Running:
    """A daemon with the real remediator; ``task_starts``: that run's first task starts after the
    group was judged and right before the remediation re-reads it (the window a keep decision
    must survive)."""
    wrap = None if task_starts is None else (lambda inner: _TaskStartsFirst(inner, url, task_starts))
    d = start_daemon(url, real_remediation=True, wrap_remediator=wrap, **settings)
    daemons.append(d)
    return d


class _TaskStartsFirst:
    """Wraps the real remediator: the target's task goes running (as Airflow's ti_run would) just
    before the remediation's re-read, after planning: a decision taken while nothing had started."""

    def __init__(self, inner: Remediator, url: str, run_id: str) -> None:
        self.inner, self.url, self.run_id = inner, url, run_id

    def execute(self, action: Action) -> RemediationResult:
        if action.run.run_id == self.run_id:
            _start_task(self.url, self.run_id)
        return self.inner.execute(action)

    def prepare(self) -> None:
        self.inner.prepare()

    def record(self, result: RemediationResult) -> None:
        self.inner.record(result)

    def close(self) -> None:
        self.inner.close()


def _start_task(url: str, run_id: str) -> None:
    sql(url, "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=:r AND task_id='extract'",
        r=run_id)  # fmt: skip


def _stop(daemons: list[Running], d: Running) -> None:
    d.stop()
    daemons.remove(d)


def _pair(url: str) -> tuple[AirflowWriter, Committed, Committed, datetime, int]:
    """The race pair (nothing started): Airflow's first run is the one the keep rule keeps."""
    writer = AirflowWriter(url)
    run_after = datetime.now(UTC)
    event = writer.event(run_after - timedelta(milliseconds=5))
    kept = writer.run("consumer", run_after, [event], job=1)
    dup = writer.run("consumer", run_after, [event], job=2)
    return writer, kept, dup, run_after, event


def _stopped_with_a_failed_task(url: str, run_id: str) -> bool:
    row = db_state(url)[run_id]
    return row.state == "failed" and row.tasks["extract"][0] == "failed" and row.note is not None


# --- (a) restart with the in-memory ledger ----------------------------------------------------------


def test_db_restart_with_memory_ledger_keeps_the_kept_run(pg_templates: Templates, daemons: list[Running]) -> None:
    """db backend: the duplicate is stopped with its starting task failed; a restart without the
    durable ledger judges the group again and leaves the kept run untouched (the note on the stopped
    run names it), reporting the duplicate as already stopped."""
    url = pg_templates.clone("3.1.2")
    settings = {"remediation": "fail", "remediation_backend": "db", "remediate_started": True}
    _, kept, dup, _, _ = _pair(url)
    first = _start(daemons, url, durable=False, task_starts=dup.run_id, **settings)
    wait_for(lambda: _stopped_with_a_failed_task(url, dup.run_id), what="the duplicate stopped")
    before = db_state(url)[kept.run_id]
    assert before.state == "queued" and before.note is None
    _stop(daemons, first)

    second = _start(daemons, url, durable=False, **settings)
    wait_for(lambda: bool(second.alerter.results()), what="the second judgement's outcome")
    time.sleep(0.5)  # room for a wrong remediation to land
    [event] = second.alerter.detected()
    assert event.finding.kept.run_id == kept.run_id
    assert second.alerter.results() == {dup.run_id: [Result.ALREADY]}
    assert db_state(url)[kept.run_id] == before


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.1.2", [FANOUT])


@pytest.mark.airflow
def test_api_restart_with_memory_ledger_keeps_the_kept_run(af312: AirflowServer, daemons: list[Running]) -> None:
    """api backend, read-only style (in-memory ledger): the duplicate's task starts between dupguard's
    re-read and its PATCH, so Airflow itself fails that task while failing the run. After a restart the
    group is judged again: the kept run (Airflow's first) stays untouched."""
    url = af312.reset(FANOUT)
    group = next(g for g in ground_truth("3.1.2", FANOUT)["expected_groups"] if g["dag_id"] == "orders_consumer_1")
    kept_id = group["first_run_id"]
    [dup_id] = [r for r in group["run_ids"] if r != kept_id]
    settings = {
        "remediation": "fail",
        "remediation_backend": "api",
        "airflow_username": "admin",
        "airflow_password": "admin",
        "dags": ("orders_consumer_1",),
        "startup_lookback": LONG_AGO,
    }
    before = db_state(url)[kept_id]

    with CountingProxy(af312.port) as proxy:  # the task starts between the re-read and the PATCH
        proxy.hooks.append(("/api/v2/dags/orders_consumer_1/dagRuns/", lambda: _start_task(url, dup_id)))
        first = _start(daemons, url, durable=False, airflow_api_url=proxy.url, **settings)
        wait_for(lambda: _stopped_with_a_failed_task(url, dup_id), what="Airflow failed the duplicate")
        _stop(daemons, first)
    assert db_state(url)[kept_id] == before

    second = _start(daemons, url, durable=False, airflow_api_url=af312.url, **settings)
    wait_for(lambda: bool(second.alerter.results()), what="the second judgement's outcome")
    time.sleep(0.5)
    [event] = second.alerter.detected()
    assert event.finding.kept.run_id == kept_id
    assert second.alerter.results() == {dup_id: [Result.ALREADY]}
    assert db_state(url)[kept_id] == before


# --- (b) a third run joins the group after the decision ----------------------------------------------


@pytest.mark.parametrize("durable", [False, True], ids=["memory-ledger", "durable-ledger"])
def test_third_run_joining_never_stops_the_kept_run(
    durable: bool, pg_templates: Templates, daemons: list[Running]
) -> None:
    """The duplicate's task started right after the group was judged (too late: left alone, no note,
    so now it looks like the run to keep). A third run of the same trigger joins later: the first
    decision stands (kept run untouched), the newcomer is stopped."""
    url = pg_templates.clone("3.1.2")
    writer, kept, dup, run_after, event = _pair(url)
    d = _start(daemons, url, durable=durable, task_starts=dup.run_id, remediation="fail", remediation_backend="db")
    wait_for(lambda: dup.run_id in d.alerter.results(), what="the first decision")
    assert d.alerter.results()[dup.run_id] == [Result.TOO_LATE]
    before = db_state(url)
    third = writer.run("consumer", run_after, [event], job=1)
    wait_for(lambda: third.run_id in d.alerter.results(), what="the third run judged")
    time.sleep(0.5)
    after = db_state(url)
    assert after[kept.run_id] == before[kept.run_id]
    assert after[dup.run_id] == before[dup.run_id]
    assert after[third.run_id].state == "failed" and kept.run_id in (after[third.run_id].note or "")
    assert {e.finding.kept.run_id for e in d.alerter.events} == {kept.run_id}
    writer.close()


# --- (c) two replicas with in-memory ledgers, each restarted -------------------------------------------


def test_two_memory_replicas_each_restarted_keep_the_kept_run(pg_templates: Templates, daemons: list[Running]) -> None:
    """Replica A stops the duplicate (its starting task failed); B, started afresh, takes over and
    judges the group again (its look-back); A restarts, takes over from B and judges it again. Nobody
    ever touches the kept run. (Each replica starts once the other stopped: a standby that watched a
    live leader does not judge that leader's term again, tests/integration/test_term_resume.py.)"""
    url = pg_templates.clone("3.1.2")
    settings = {"remediation": "fail", "remediation_backend": "db", "remediate_started": True}
    _, kept, dup, _, _ = _pair(url)
    a = _start(daemons, url, durable=False, task_starts=dup.run_id, **settings)
    wait_for(a.is_leader, what="A leads")
    wait_for(lambda: _stopped_with_a_failed_task(url, dup.run_id), what="A stopped the duplicate")
    before = db_state(url)
    kept_seen = [e.finding.kept.run_id for e in a.alerter.detected()]

    _stop(daemons, a)  # failover to B
    b = _start(daemons, url, durable=False, **settings)
    wait_for(lambda: bool(b.alerter.results()), timeout=30, what="B judged the group")
    _stop(daemons, b)  # failover back to the restarted A
    a2 = _start(daemons, url, durable=False, **settings)
    wait_for(lambda: bool(a2.alerter.results()), timeout=30, what="restarted A judged the group")
    time.sleep(0.5)
    kept_seen += [e.finding.kept.run_id for d in (b, a2) for e in d.alerter.detected()]
    assert kept_seen == [kept.run_id] * 3
    assert b.alerter.results() == a2.alerter.results() == {dup.run_id: [Result.ALREADY]}
    assert db_state(url) == before


# --- the read-only grants: dag_run_note is read ---------------------------------------------------------

READ_ONLY_GRANTS = "dag_run, task_instance, dagrun_asset_event, asset_event, asset, job, alembic_version"


@pytest.mark.parametrize("with_note_grant", [True, False], ids=["documented-grants", "old-grants"])
def test_read_only_role_reads_the_notes_or_says_it_cannot(
    with_note_grant: bool, pg_templates: Templates, daemons: list[Running]
) -> None:
    """A role with exactly the documented read-only grants (SELECT on dag_run_note included) sees the
    note of an earlier stop and keeps the run it names. A role granted before that judges nothing (a
    judgement without the notes could keep the stopped run): its polls fail naming the missing GRANT,
    and once it is granted the group is judged, rightly, with nothing lost."""
    import uuid

    import structlog
    from sqlalchemy.engine import make_url

    from tests.pg import execute_admin

    url = pg_templates.clone("3.1.2")
    db = str(make_url(url).database)
    role = f"dupguard_ro_{uuid.uuid4().hex[:8]}"
    tables = READ_ONLY_GRANTS + (", dag_run_note" if with_note_grant else "")
    execute_admin(f"CREATE ROLE {role} LOGIN")
    execute_admin(f'GRANT CONNECT ON DATABASE "{db}" TO {role}')
    execute_admin(f"GRANT USAGE ON SCHEMA public TO {role}; GRANT SELECT ON {tables} TO {role}", dbname=db)
    writer, kept, dup, _, _ = _pair(url)
    note = f"dupguard stopped this run as a duplicate of {kept.run_id} (same asset trigger, HA scheduler race)"
    sql(url, "UPDATE dag_run SET state='failed' WHERE run_id=:r", r=dup.run_id)
    sql(url, "UPDATE task_instance SET state=CASE task_id WHEN 'extract' THEN 'failed' ELSE 'skipped' END "
        "WHERE run_id=:r", r=dup.run_id)  # fmt: skip
    sql(url, "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) VALUES (:i, :c, now(), now())",
        i=dup.id, c=note)  # fmt: skip
    ro_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        with structlog.testing.capture_logs() as logged:
            d = start_daemon(ro_url, durable=False)
            daemons.append(d)
            if not with_note_grant:
                wait_for(lambda: any(e["event"] == "poll_failed" for e in logged), what="the failing poll")
                time.sleep(0.3)
                assert d.alerter.events == []
                failed = next(e for e in logged if e["event"] == "poll_failed")
                assert "GRANT SELECT ON dag_run_note" in failed["error"]
                execute_admin(f"GRANT SELECT ON dag_run_note TO {role}", dbname=db)
            wait_for(lambda: len(d.alerter.detected()) == 1, timeout=20, what="the group detected")
            _stop(daemons, d)
        [event] = d.alerter.detected()
        assert event.finding.kept.run_id == kept.run_id
    finally:
        writer.close()
        execute_admin(f"REVOKE ALL ON ALL TABLES IN SCHEMA public FROM {role}", dbname=db)
        execute_admin(f"REVOKE ALL ON SCHEMA public FROM {role}", dbname=db)
        execute_admin(f'REVOKE ALL ON DATABASE "{db}" FROM {role}')
        execute_admin(f"DROP ROLE {role}")

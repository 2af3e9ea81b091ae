"""The daemon against real PostgreSQL with the real Airflow 3.1.2 schema: detection while running,
late commits, two replicas, failover, restarts and health endpoints."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import pytest
from structlog.testing import capture_logs

from tests.daemon_harness import RecordingRemediator, Running, start_daemon, wait_for
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration


@pytest.fixture
def db_url(pg_templates: Templates) -> str:
    return pg_templates.clone("3.1.2")


@pytest.fixture
def writer(db_url: str) -> Iterator[AirflowWriter]:
    w = AirflowWriter(db_url)
    yield w
    w.close()


def test_duplicate_committed_while_running_is_detected_once(
    db_url: str, writer: AirflowWriter, daemons: list[Running]
) -> None:
    """Ordinary runs pass silently; a race pair committed later is one DETECTED alert, kept = first,
    followed by one OUTCOME alert carrying the remediation's result (remediation runs off the loop)."""
    d = start_daemon(db_url)
    daemons.append(d)
    wait_for(d.is_leader, what="leadership")
    for _ in range(3):
        writer.ordinary("consumer")
    first, second = writer.duplicate_pair("consumer")
    wait_for(lambda: len(d.alerter.detected()) == 1, what="one alert")
    time.sleep(0.3)  # further polls must not repeat it
    [event] = d.alerter.detected()
    assert event.finding.kept.run_id == first.run_id
    assert [r.run_id for r in event.finding.duplicates] == [second.run_id]
    assert [a.run.run_id for a in d.remediator.actions] == [second.run_id]
    wait_for(lambda: len(d.alerter.events) == 2, what="the outcome")
    time.sleep(0.3)
    assert [e.kind.value for e in d.alerter.events] == ["detected", "outcome"]
    assert [r.action.run.run_id for r in d.alerter.events[1].results] == [second.run_id]


def test_late_commit_with_lower_id_is_not_missed(db_url: str, writer: AirflowWriter, daemons: list[Running]) -> None:
    """A duplicate whose id was taken before a later-committed run's id is still found when it commits."""
    d = start_daemon(db_url)
    daemons.append(d)
    wait_for(d.is_leader, what="leadership")
    run_after = datetime.now(UTC)
    event = writer.event(run_after)
    first = writer.run("consumer", run_after, [event], job=1)
    slow = AirflowWriter(db_url, seed=7)
    slow.conn.autocommit = False
    cur = slow.conn.cursor()
    cur.execute(
        "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, queued_at, creating_job_id, clear_number, "
        "span_status) VALUES ('consumer', 'asset_triggered__late_dup', 'asset_triggered', %s, 'queued', now(), 2, 0, "
        "'not_started') RETURNING id",
        (run_after,),
    )
    late_id = cur.fetchone()[0]
    cur.execute("INSERT INTO dagrun_asset_event (dag_run_id, event_id) VALUES (%s, %s)", (late_id, event))
    later = writer.ordinary("other_dag")  # commits a higher id while the duplicate is still open
    assert later.id > late_id
    wait_for(lambda: d.detector is not None and d.detector.tracker.high >= later.id, what="high id")
    assert d.alerter.detected() == []
    slow.conn.commit()
    slow.close()
    wait_for(lambda: len(d.alerter.detected()) == 1, what="late duplicate")
    assert d.alerter.detected()[0].finding.kept.run_id == first.run_id


def lock_holders(url: str, key: int) -> list[int]:
    """Backend pids holding the advisory lock ``key`` (granted) in this database, as PostgreSQL sees it."""
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            # A bigint key is stored as classid (high 32 bits) and objid (low 32 bits), objsubid 1.
            cur.execute(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND (classid::bigint << 32 | objid::bigint) = %s",
                (key,),
            )
            return sorted(row[0] for row in cur.fetchall())
    finally:
        conn.close()


def polls(d: Running) -> float:
    """Poll passes this replica ran (only a replica that believes it leads polls)."""
    return d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0


def own_state(d: Running) -> str:
    """The state this replica reports about itself (``dupguard_state``, what /readyz names)."""
    return d.daemon.status.current.state.value


def test_two_replicas_one_acts_and_standby_takes_over(
    db_url: str, writer: AirflowWriter, daemons: list[Running]
) -> None:
    """Two daemons on one DB: exactly one leads, seen three ways that two leaders would fail: the
    database shows one holder of the lock; each replica's own state says leading / standby; and the
    standby never polls (its poll counter, which no shared ledger deduplicates, stays at 0) nor
    alerts nor remediates. Killing the leader's lock session hands leadership to the standby: again
    one holder, the old leader reports itself no longer leading and stops polling, and only the new
    leader handles the next duplicate."""
    a = start_daemon(db_url)
    daemons.append(a)
    wait_for(a.is_leader, what="first leader")
    b = start_daemon(db_url)
    daemons.append(b)
    key = a.daemon.config.lock_key
    wait_for(lambda: own_state(b) == "standby", what="the second replica to report standby")
    first_dup = writer.duplicate_pair("consumer")[1]
    wait_for(lambda: len(a.alerter.detected()) == 1, what="leader alert")
    wait_for(lambda: len(a.alerter.outcomes()) == 1, what="leader outcome")
    # a polled many times meanwhile; a second leader would have polled as often
    assert polls(a) > 0 and polls(b) == 0
    assert (own_state(a), own_state(b)) == ("leading", "standby")
    assert a.is_leader() and not b.is_leader()
    (old_holder,) = lock_holders(db_url, key)
    assert b.alerter.events == [] and b.remediator.actions == []
    assert [x.run.run_id for x in a.remediator.actions] == [first_dup.run_id]

    admin = psycopg2.connect(db_url)
    admin.autocommit = True
    with admin.cursor() as cur:  # the leader's lock session dies, as with a SIGKILLed pod
        cur.execute("SELECT pg_terminate_backend(%s)", (old_holder,))
    admin.close()
    took = wait_for(b.is_leader, timeout=20, what="standby takeover")
    print(f"standby took over after {took:.2f}s")
    wait_for(lambda: own_state(a) == "standby" and not a.is_leader(), timeout=20, what="old leader to step down")
    a_polls = polls(a)  # a poll already running when it stepped down may still finish: at most one
    (new_holder,) = lock_holders(db_url, key)
    assert new_holder != old_holder
    second_dup = writer.duplicate_pair("consumer")[1]
    wait_for(lambda: len(b.alerter.detected()) == 1, what="the new leader's alert")
    wait_for(lambda: len(b.alerter.outcomes()) == 1, what="the new leader's outcome")
    assert polls(b) > 0 and polls(a) <= a_polls + 1
    assert (own_state(a), own_state(b)) == ("standby", "leading")
    assert lock_holders(db_url, key) == [new_holder]
    assert len(a.alerter.detected()) == 1 and [x.run.run_id for x in a.remediator.actions] == [first_dup.run_id]
    assert [x.run.run_id for x in b.remediator.actions] == [second_dup.run_id]


@pytest.fixture
def hanging_api() -> Iterator[str]:
    """An "Airflow API" that accepts connections (the kernel completes the handshake into the listen
    backlog) and never answers a byte: the API server hung, or a network path that drops replies."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def test_start_up_never_waits_on_a_hanging_airflow_api(
    db_url: str, writer: AirflowWriter, daemons: list[Running], hanging_api: str
) -> None:
    """With the api remediation backend and the Airflow API hanging, a starting leader
    detects a duplicate committed right after start before its first token request has even timed
    out (an ordering of events, not a time limit), and keeps leading: the heartbeat never waits on
    the API. The failure is loud once it is known: one log line, the readiness reason and
    ``dupguard_remediation_ready{backend="api"} 0``, while the replica stays up (it detects)."""
    seen_at_detection: list[list[str]] = []
    with capture_logs() as logs:
        d = start_daemon(
            db_url,
            real_remediation=True,
            remediation="fail",
            remediation_backend="api",
            airflow_api_url=hanging_api,
            airflow_username="admin",
            airflow_password="admin",
            airflow_timeout=timedelta(seconds=8),
        )
        daemons.append(d)
        record = d.alerter.notify

        def notify(event: Any) -> None:  # what had been logged when the alert went out
            seen_at_detection.append([e["event"] for e in logs])
            record(event)

        d.alerter.notify = notify  # type: ignore[method-assign]
        writer.duplicate_pair("consumer")
        wait_for(lambda: len(d.alerter.detected()) == 1, timeout=60, what="the duplicate's detection")
        wait_for(lambda: any(e["event"] == "airflow_token_unavailable" for e in logs), timeout=60, what="token timeout")
        assert "airflow_token_unavailable" not in seen_at_detection[0], "detection waited for the token request"
        wait_for(lambda: "remediation not ready" in d.daemon.ready()[1], what="the readiness reason")
        events = [e["event"] for e in logs]
    (failure,) = [e for e in logs if e["event"] == "airflow_token_unavailable"]
    assert "/auth/token" in failure["error"] and "password" not in failure["error"]
    ready, reason = d.daemon.ready()
    assert ready and reason.startswith("leading:") and failure["error"] in reason, reason
    assert d.metrics.registry.get_sample_value("dupguard_remediation_ready", {"backend": "api"}) == 0
    assert "standing_by" not in events and d.is_leader(), "the hanging API held up the leader heartbeat"


def test_restart_with_durable_ledger_does_not_realert(db_url: str, writer: AirflowWriter) -> None:
    """A restarted daemon resumes from the ledger watermark and does not alert the same group again."""
    first = start_daemon(db_url)
    wait_for(first.is_leader, what="leadership")
    writer.duplicate_pair("consumer")
    wait_for(lambda: len(first.alerter.detected()) == 1, what="alert")
    first.stop()
    second = start_daemon(db_url)
    try:
        wait_for(second.is_leader, what="leadership")
        writer.duplicate_pair("consumer2")
        wait_for(lambda: len(second.alerter.detected()) == 1, what="new alert")
        time.sleep(0.3)
        assert [e.finding.dag_id for e in second.alerter.detected()] == ["consumer2"]
    finally:
        second.stop()


def test_memory_ledger_restart_reexamines_lookback(db_url: str, writer: AirflowWriter) -> None:
    """Without a durable ledger a restart looks back `startup_lookback` and may alert again (documented)."""
    first = start_daemon(db_url, durable=False)
    wait_for(first.is_leader, what="leadership")
    writer.duplicate_pair("consumer")
    wait_for(lambda: len(first.alerter.detected()) == 1, what="alert")
    first.stop()
    second = start_daemon(db_url, durable=False)
    try:
        wait_for(lambda: len(second.alerter.detected()) == 1, what="re-alert from look-back")
    finally:
        second.stop()


def test_health_endpoints(db_url: str) -> None:
    """/livez and /readyz answer 200 while running; /metrics exposes the documented metrics."""
    from detector.app.health import HealthServer

    d = start_daemon(db_url)
    server = HealthServer(0, d.metrics.registry, d.daemon.live, d.daemon.ready, host="127.0.0.1").start()
    try:
        wait_for(lambda: d.daemon.ready()[0], what="ready")
        base = f"http://127.0.0.1:{server.port}"
        for path in ("/livez", "/readyz"):
            with urllib.request.urlopen(base + path, timeout=5) as resp:  # noqa: S310 - loopback test server
                assert resp.status == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:  # noqa: S310
            body = resp.read().decode()
        for name in (
            "dupguard_duplicate_groups_detected_total",
            "dupguard_poll_duration_seconds",
            "dupguard_detection_latency_seconds",
            "dupguard_last_successful_poll_timestamp_seconds",
            "dupguard_leader",
            "dupguard_db_up",
            "dupguard_build_info",
        ):
            assert name in body
        assert 'airflow_version="3.1"' in body
    finally:
        server.close()
        d.stop()


def test_init_db_creates_only_its_schema_and_drop_removes_it(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`init-db` adds schema dupguard (3 tables) and nothing in public; `init-db --drop` removes it."""
    from detector.app.cli import main

    def tables() -> set[tuple[str, str]]:
        conn = psycopg2.connect(db_url)
        with conn.cursor() as cur:
            cur.execute("SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema <> "
                        "'information_schema' AND table_schema NOT LIKE 'pg_%'")  # fmt: skip
            found = set(cur.fetchall())
        conn.close()
        return found

    before = tables()
    assert main(["init-db", "--database-url", db_url]) == 0
    added = tables() - before
    assert added == {("dupguard", "claims"), ("dupguard", "notes"), ("dupguard", "state")}
    assert main(["init-db", "--database-url", db_url, "--drop"]) == 0
    assert tables() == before
    assert "removed" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("version", "scenario"),
    [
        ("3.2.2", "race_partitioned"),
        ("3.1.2", "race_asset_fanout"),
        ("3.0.6", "race_overlap"),
        ("3.1.2", "race_overlap"),
    ],
)
def test_airflow_made_race_appearing_while_running(
    version: str, scenario: str, pg_templates: Templates, daemons: list[Running]
) -> None:
    """Rows of a race made by Airflow's own scheduler code land in a watched database: every group of
    the ground truth is detected once, with Airflow's first run kept (partitioned path included)."""
    from tests.pg import FIXTURES, execute_admin, fixture_sql, ground_truth

    url = pg_templates.clone(version)
    d = start_daemon(url)
    daemons.append(d)
    wait_for(lambda: d.detector is not None, what="watching")
    execute_admin(fixture_sql(FIXTURES / "scenarios" / version / f"{scenario}.sql"), dbname=url.rsplit("/", 1)[1])
    truth = ground_truth(version, scenario)["expected_groups"]
    wait_for(lambda: len(d.alerter.detected()) == len(truth), what="every group")
    time.sleep(0.3)
    found = sorted((e.finding.dag_id, e.finding.kept.run_id, e.finding.kind.value) for e in d.alerter.detected())
    assert found == sorted((g["dag_id"], g["first_run_id"], g["kind"]) for g in truth)


def test_groups_of_one_race_are_remediated_concurrently(pg_templates: Templates, daemons: list[Running]) -> None:
    """One event duplicated three consumers (Airflow-made race): their remediations overlap instead of
    queueing behind each other, and each duplicate is acted on exactly once."""
    from tests.daemon_harness import RecordingRemediator
    from tests.pg import FIXTURES, execute_admin, fixture_sql, ground_truth

    url = pg_templates.clone("3.1.2")
    slow = RecordingRemediator(delay=0.3)
    d = start_daemon(url, remediator=slow)
    daemons.append(d)
    wait_for(lambda: d.detector is not None, what="watching")
    execute_admin(fixture_sql(FIXTURES / "scenarios/3.1.2/race_asset_fanout.sql"), dbname=url.rsplit("/", 1)[1])
    truth = ground_truth("3.1.2", "race_asset_fanout")["expected_groups"]
    wait_for(lambda: len(d.alerter.detected()) == len(truth), what="every group")
    duplicates = sorted(r for g in truth for r in g["run_ids"] if r != g["first_run_id"])
    wait_for(lambda: len(d.alerter.results()) == len(duplicates), what="every outcome")  # off the loop
    assert slow.most_at_once >= 2
    assert sorted(a.run.run_id for a in slow.actions) == duplicates


@pytest.mark.parametrize("version", ["3.0.6", "3.1.2"])
def test_overlap_race_plans_to_stop_only_the_run_that_consumed_less(version: str, pg_templates: Templates) -> None:
    """Airflow-made overlap race (different run_after, one shared event): one confirmed group, the run
    holding both events kept, the remediation planned for the other run only."""
    from tests.pg import FIXTURES, execute_admin, fixture_sql, ground_truth

    url = pg_templates.clone(version)
    recorder = RecordingRemediator()
    d = start_daemon(url, remediator=recorder, remediation="fail")
    try:
        wait_for(lambda: d.detector is not None, what="watching")
        sql = fixture_sql(FIXTURES / "scenarios" / version / "race_overlap.sql")
        execute_admin(sql, dbname=url.rsplit("/", 1)[1])
        wait_for(lambda: len(recorder.actions) >= 1, what="the remediation")
        time.sleep(0.3)
    finally:
        d.stop()
    [truth] = ground_truth(version, "race_overlap")["expected_groups"]
    [event] = d.alerter.detected()
    assert event.finding.confidence.value == "confirmed"
    assert event.finding.kept.run_id == truth["first_run_id"]
    duplicate = next(r for r in truth["run_ids"] if r != truth["first_run_id"])
    assert [(a.run.run_id, a.outcome.value) for a in recorder.actions] == [(duplicate, "remediate")]


def test_a_run_joining_an_overlap_group_through_another_run_keeps_its_key(
    db_url: str, writer: AirflowWriter, daemons: list[Running]
) -> None:
    """A (t2, {e1, e2}) and B (t1, {e2, e3}) overlap: one suspected group, keyed on A. C (t3, {e3})
    shares an event with B only; the group it joins is still A's (sibling of a sibling), so it is
    not alerted as a new group: the same group is announced again as grown, naming C."""
    d = start_daemon(db_url)
    daemons.append(d)
    wait_for(d.is_leader, what="leadership")
    now = datetime.now(UTC)
    e1, e2, e3 = (writer.event(now) for _ in range(3))
    a = writer.run("consumer", now, [e1, e2], job=1)
    b = writer.run("consumer", now - timedelta(milliseconds=100), [e2, e3], job=2)
    wait_for(lambda: len(d.alerter.detected()) == 1, what="the overlap group")
    c = writer.run("consumer", now + timedelta(milliseconds=50), [e3], job=2)
    wait_for(lambda: d.detector is not None and d.detector.tracker.high >= c.id, what="C judged")
    time.sleep(0.3)
    # without the sibling's siblings, C's group {B, C} was a new one (a new key, no new_runs)
    first, grown = d.alerter.detected()
    assert {r.run_id for r in first.finding.runs} == {a.run_id, b.run_id}
    assert first.finding.confidence.value == "suspected"
    assert grown.finding.key == first.finding.key
    assert grown.new_runs == (c.run_id,)

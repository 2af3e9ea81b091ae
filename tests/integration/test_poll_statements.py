"""The poll path's shape, not its speed: what an idle poll and a leader check send to a real
PostgreSQL with the real Airflow 3.1.2 schema, directly and through a real PgBouncer. Statements are
counted where they leave the driver (a counting psycopg2 cursor on every connection of the engine), so
the prepared probe, which bypasses SQLAlchemy's execution path, is counted like everything else; pool
checkouts are counted too, as each one costs a ``pool_pre_ping`` round trip and a ROLLBACK on return.

The shape this pins (benchmarks/results/measurements.md, "Poll path shape"):
- an idle poll on the leader: exactly 1 statement on the long-lived poll connection, 0 pool
  checkouts: ``EXECUTE "dupguard_top_run_id"`` (the probe prepared once, ``detector.metadb.prepared``)
  on a direct connection; the unprepared ``SELECT max(dag_run.id)`` through PgBouncer;
- one leader check on a leader that polled since the last check: 1 statement (the heartbeat) on the
  lock connection and nothing on the main engine; without a poll since the last check the database-up
  ping comes back (1 statement plus 1 checkout).
A change that adds work to either path fails here. Before the poll path was cut down, an idle poll sent the full
``new_runs`` select and every leader check pinged through the pool (4 round trips a second).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2.extensions
import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine.default import CACHE_HIT

from detector.app.daemon import Daemon, Parts
from detector.app.leader import AdvisoryLock
from detector.app.ledger import DbLedger, init_db
from detector.config import Config
from detector.metadb import consumption, dag_runs, siblings
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.sources.database.poll import IncrementalDetector, NewRowTracker
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import RecordingAlerter, RecordingRemediator, incremental_detector
from tests.pg import Templates
from tests.pgbouncer import pgbouncer
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration

IDLE_POLLS = 50
CHECKS = 10


@dataclass
class Counter:
    statements: list[str] = field(default_factory=list)
    checkouts: int = 0

    def reset(self) -> None:
        self.statements.clear()
        self.checkouts = 0


def _count(engine: Engine) -> Counter:
    """Counts every statement any connection of ``engine`` sends through psycopg2, and every checkout."""
    counter = Counter()

    class CountingCursor(psycopg2.extensions.cursor):  # type: ignore[misc]
        def execute(self, query: Any, vars: Any = None) -> Any:
            counter.statements.append(query if isinstance(query, str) else query.as_string(self.connection))
            return super().execute(query, vars)

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.cursor_factory = CountingCursor

    def on_checkout(*args: Any) -> None:
        counter.checkouts += 1

    event.listen(engine, "connect", on_connect)
    event.listen(engine.pool, "checkout", on_checkout)
    return counter


@dataclass
class Rig:
    daemon: Daemon
    main: Counter
    lock: Counter
    db_url: str  # direct, for the test's own writes
    direct: bool  # the daemon's own connections are direct (else through PgBouncer)


@pytest.fixture(params=["direct", "pgbouncer"])
def rig(request: pytest.FixtureRequest, pg_templates: Templates) -> Iterator[Rig]:
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    for i in range(5):  # some history, one real duplicate pair: a non-trivial table to poll
        writer.ordinary(f"dag_{i}")
    writer.duplicate_pair("consumer", gap=timedelta(0))
    writer.close()
    if request.param == "pgbouncer":
        with pgbouncer(url, "transaction") as bounced:
            yield from _rig(bounced, url)
    else:
        yield from _rig(url, url)


def _rig(url: str, lock_url: str) -> Iterator[Rig]:
    """The daemon's polls on ``url``; its lock on ``lock_url`` (direct, as DUPGUARD_LOCK_DATABASE_URL would
    be set beside PgBouncer, so that the lock connection's shape is the same in both rigs)."""
    config = Config.of(database_url=url, http_port=0, startup_lookback=timedelta(minutes=5))
    engine = make_engine(parse_url(url))
    lock_engine = make_engine(parse_url(lock_url), pool_size=1)
    main, lock_count = _count(engine), _count(lock_engine)
    init_db(engine)
    lock = AdvisoryLock(lock_engine, config.lock_key, mode=config.lock_mode, lease=3 * config.leader_check_interval)
    alerter = RecordingAlerter()
    metrics, ledger = Metrics(), DbLedger(engine)
    parts = Parts(
        source=DatabaseSource(config, open_airflow_db(engine), ledger, metrics),
        leadership=lock,
        ledger=ledger,
        remediator=RecordingRemediator(),
        alerter=alerter,
        metrics=metrics,
    )
    daemon = Daemon(config, parts)
    rig = Rig(daemon, main, lock_count, lock_url, direct=url == lock_url)
    daemon.check_leader()
    assert lock.is_leader(datetime.now(UTC)), "the only replica takes the lock"
    # First pass: starts the term (look-back) and judges the planted pair; then the table is quiet.
    assert daemon.poll_pass()
    assert daemon.poll_pass()
    assert alerter.detected(), "the planted duplicate was found: the poll really reads dag_run"
    yield rig
    daemon.shutdown(timeout=1.0)
    parts.source.close()
    engine.dispose()
    lock_engine.dispose()


def test_idle_poll_sends_exactly_one_statement(rig: Rig) -> None:
    """Idle: one statement per poll, the same each time, on the held poll connection; prepared when the
    connection is direct, the unprepared probe through PgBouncer (a prepared statement would not stay
    on one server connection there)."""
    rig.main.reset()
    rig.lock.reset()
    for _ in range(IDLE_POLLS):
        assert rig.daemon.poll_pass()
    assert len(rig.main.statements) == IDLE_POLLS, rig.main.statements[:5]
    assert len(set(rig.main.statements)) == 1, "every idle poll sends the same statement"
    probe = rig.main.statements[0]
    if rig.direct:
        assert probe == 'EXECUTE "dupguard_top_run_id"', probe
    else:
        assert "max(dag_run.id)" in probe and "JOIN" not in probe, probe
    assert rig.main.checkouts == 0, "idle polls reuse one connection: no checkout, pre-ping or ROLLBACK"
    assert rig.lock.statements == [] and rig.lock.checkouts == 0


def test_prepared_only_on_a_direct_connection(rig: Rig) -> None:
    """The probe is prepared on the server only where the connection was verified direct."""
    source = rig.daemon.parts.source
    assert isinstance(source, DatabaseSource)
    assert source.probe_prepared is rig.direct


def test_a_new_run_still_takes_the_full_fetch(rig: Rig, pg_templates: Templates) -> None:
    """The probe only gates the fetch: a new run above the watermark is fetched (and judged) at once."""
    detector = incremental_detector(rig.daemon)
    assert isinstance(detector, IncrementalDetector)
    before = detector.tracker.high
    writer = AirflowWriter(rig.db_url)
    committed = writer.ordinary("fresh_dag")
    writer.close()
    rig.main.reset()
    assert rig.daemon.poll_pass()
    assert detector.tracker.high == committed.id > before
    assert any("FROM dag_run LEFT OUTER JOIN job" in s for s in rig.main.statements), rig.main.statements


def test_leader_check_sends_only_the_heartbeat_while_polls_succeed(rig: Rig) -> None:
    """A leader that polled since its last check: the heartbeat on the lock connection, nothing else."""
    rig.daemon.check_leader()
    rig.main.reset()
    rig.lock.reset()
    for _ in range(CHECKS):
        assert rig.daemon.poll_pass()
        rig.daemon.check_leader()
    assert rig.daemon.parts.leadership.is_leader(datetime.now(UTC))
    assert len(rig.lock.statements) == CHECKS, rig.lock.statements[:5]
    assert rig.lock.checkouts == 0, "the lock connection is held, never checked out again"
    assert len(rig.main.statements) == CHECKS, "only the polls' probes: no database-up ping"
    assert rig.main.checkouts == 0
    assert rig.daemon.db_ok


def test_leader_check_pings_when_no_poll_succeeded(rig: Rig) -> None:
    """Without a successful poll since the last check, the database-up ping comes back: one pooled
    checkout (with its pre-ping) and one statement per check."""
    rig.daemon.check_leader()
    rig.main.reset()
    rig.lock.reset()
    for _ in range(CHECKS):
        rig.daemon.check_leader()
    assert len(rig.lock.statements) == CHECKS, rig.lock.statements[:5]
    assert rig.main.checkouts == CHECKS
    pings = [s for s in rig.main.statements if s != "SELECT 1"]  # pool_pre_ping's (not on a new connection)
    assert len(pings) == CHECKS, rig.main.statements[:6]


def _statements_to_detect(rig: Rig, groups: int, commit: Callable[[AirflowWriter], object]) -> list[str]:
    """The statements of the poll passes that detect the ``groups`` pairs ``commit`` writes."""
    writer = AirflowWriter(rig.db_url)
    commit(writer)
    writer.close()
    alerter = rig.daemon.parts.alerter
    assert isinstance(alerter, RecordingAlerter)
    before = len(alerter.detected())
    rig.main.reset()
    for _ in range(5):
        assert rig.daemon.poll_pass()
        if len(alerter.detected()) >= before + groups:
            break
    assert len(alerter.detected()) == before + groups, "every pair was detected"
    return list(rig.main.statements)


def test_judging_a_duplicate_checks_out_no_pooled_connection(rig: Rig) -> None:
    """The detection path (fetch, siblings, earlier decisions, task progress, the ledger's claims and
    roles, the watermark) runs on the held poll connection: no checkout, pre-ping, BEGIN or COMMIT."""
    statements = _statements_to_detect(rig, 1, lambda w: w.duplicate_pair("consumer_fresh", gap=timedelta(0)))
    assert rig.main.checkouts == 0, statements
    assert any("INSERT INTO dupguard.claims" in s for s in statements), "claims went to the database"


def test_a_pairs_notes_are_read_with_its_task_progress(rig: Rig) -> None:
    """Judging a pair reads ``dag_run_note`` once, in the statement that reads its task instances: the
    guard's notes and the notes of earlier decisions were two more round trips before its alert."""
    statements = _statements_to_detect(rig, 1, lambda w: w.duplicate_pair("consumer_notes", gap=timedelta(0)))
    notes = [s for s in statements if "dag_run_note" in s]
    assert len(notes) == 1 and "task_instance" in notes[0], notes


def test_a_pairs_events_are_read_with_their_assets(rig: Rig) -> None:
    """Judging a pair reads the assets its alert names in the statement that reads the new runs' consumed
    events (with the trigger events' extra): the events, the trigger events and the asset names were three
    round trips in a row before its alert."""
    statements = _statements_to_detect(rig, 1, lambda w: w.duplicate_pair("consumer_assets", gap=timedelta(0)))
    named = [s for s in statements if "asset.name" in s]
    assert len(named) == 1 and "dagrun_asset_event" in named[0] and "asset_event.extra" in named[0], named
    assert not [s for s in statements if "FROM asset_event" in s], "no read of asset_event of its own"


def _storm_statements(rig: Rig, groups: int, prefix: str) -> list[str]:
    """The statements of the poll passes that detect a storm of ``groups`` pairs committed at once."""
    return _statements_to_detect(rig, groups, lambda w: w.storm(groups, dag_prefix=prefix))


def test_a_storms_poll_sends_as_many_statements_for_150_groups_as_for_10(rig: Rig) -> None:
    """The groups of one poll (150 pairs: 150 sibling questions) are asked for their siblings in one
    statement, claimed in one and their roles and notes recorded in one each: the poll's statements do
    not grow with its groups. A sibling UNION per 100 runs and an INSERT per group's claims, roles and
    notes made a storm of 10,000 groups take three minutes to detect."""
    ten = _storm_statements(rig, 10, "small_storm")
    many = _storm_statements(rig, 150, "big_storm")
    claims_of = [[s for s in statements if "INSERT INTO dupguard.claims" in s] for statements in (ten, many)]
    assert len(claims_of[1]) == len(claims_of[0]) >= 1
    assert len(many) == len(ten), (len(ten), len(many))


def test_a_terms_first_pair_is_judged_with_statements_already_compiled(pg_templates: Templates) -> None:
    """A leader term's start sends the judging's statements once with nothing to ask (``warm``), so its
    first duplicate does not pay their compilation: it was about 10 ms later to its alert than the next
    ones (the first pair of every run in benchmarks/results/detection_latency-*.json)."""
    url = pg_templates.clone("3.1.2")
    engine = make_engine(parse_url(url))
    t = open_airflow_db(engine).tables
    with engine.connect() as conn:
        siblings.warm(conn, t)
        consumption.warm(conn, t)
    writer = AirflowWriter(url)
    writer.duplicate_pair("consumer", gap=timedelta(0))
    writer.close()
    misses: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if context.cache_hit is not CACHE_HIT:
            misses.append(statement)

    try:
        with engine.connect() as conn:
            runs = dag_runs.new_runs(conn, t, 0, [], 100)  # the poll's own statement, sent at every poll
            event.listen(engine, "after_cursor_execute", seen)
            findings = IncrementalDetector(tables=t, tracker=NewRowTracker(high=0)).judge(conn, runs, datetime.now(UTC))
            event.remove(engine, "after_cursor_execute", seen)
    finally:
        engine.dispose()
    assert [len(f.runs) for f in findings] == [2], "the pair is judged a group"
    assert misses == []

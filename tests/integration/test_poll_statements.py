"""The poll path's shape, not its speed (issue 16): what an idle poll and a leader heartbeat send to a
real PostgreSQL with the real Airflow 3.1.2 schema. Statements are counted where they leave
SQLAlchemy (``before_cursor_execute``); pool checkouts are counted too, as each one costs a
``pool_pre_ping`` round trip and a ROLLBACK on return, which never pass through that event.

Recorded on main when this test was written (docs/benchmarks.md, "Poll path shape"):
- an idle poll on the leader: exactly 1 statement (``queries.new_runs``) on the long-lived poll
  connection, 0 pool checkouts;
- one leader check (``Daemon.check_leader``) on the leader: 1 statement on the lock connection
  (the heartbeat ``SELECT 1``), and 1 statement plus 1 pool checkout on the main engine (the
  database-up ping, ``Daemon._ping_db``): 3 round trips per check interval besides the pre-ping.
A change that adds work to either path fails here; lowering the counts is the goal of issue 16, so
update the numbers (and the doc) when a cut lands.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event

from detector.app.daemon import Daemon, Parts
from detector.app.leader import AdvisoryLock
from detector.app.ledger import DbLedger, init_db
from detector.config import Config
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import RecordingAlerter, RecordingRemediator
from tests.pg import Templates
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
    counter = Counter()

    def on_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        counter.statements.append(statement)

    def on_checkout(*args: Any) -> None:
        counter.checkouts += 1

    event.listen(engine, "before_cursor_execute", on_execute)
    event.listen(engine.pool, "checkout", on_checkout)
    return counter


@dataclass
class Rig:
    daemon: Daemon
    main: Counter
    lock: Counter


@pytest.fixture
def rig(pg_templates: Templates) -> Iterator[Rig]:
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    for i in range(5):  # some history, one real duplicate pair: a non-trivial table to poll
        writer.ordinary(f"dag_{i}")
    writer.duplicate_pair("consumer", gap=timedelta(0))
    writer.close()
    config = Config.of(database_url=url, http_port=0, startup_lookback=timedelta(minutes=5))
    engine = make_engine(parse_url(url))
    init_db(engine)
    lock_engine = make_engine(parse_url(url), pool_size=1)
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
    rig = Rig(daemon, _count(engine), _count(lock_engine))
    daemon.check_leader()
    assert lock.is_leader(datetime.now(UTC)), "the only replica takes the lock"
    # First pass: starts the term (look-back) and judges the planted pair; then the table is quiet.
    assert daemon.poll_pass()
    assert daemon.poll_pass()
    assert alerter.detected(), "the planted duplicate was found: the poll really reads dag_run"
    yield rig
    daemon.shutdown(timeout=1.0)
    engine.dispose()
    lock_engine.dispose()


def test_idle_poll_sends_exactly_one_statement(rig: Rig) -> None:
    rig.main.reset()
    rig.lock.reset()
    for _ in range(IDLE_POLLS):
        assert rig.daemon.poll_pass()
    assert len(rig.main.statements) == IDLE_POLLS, rig.main.statements[:5]
    assert len(set(rig.main.statements)) == 1, "every idle poll sends the same statement"
    assert "FROM dag_run" in rig.main.statements[0]
    assert rig.main.checkouts == 0, "idle polls reuse one connection: no checkout, pre-ping or ROLLBACK"
    assert rig.lock.statements == [] and rig.lock.checkouts == 0


def test_leader_check_is_bounded(rig: Rig) -> None:
    rig.main.reset()
    rig.lock.reset()
    for _ in range(CHECKS):
        rig.daemon.check_leader()
    assert rig.daemon.parts.leadership.is_leader(datetime.now(UTC))
    # The heartbeat: one statement on the held lock connection, no new connection.
    assert len(rig.lock.statements) == CHECKS, rig.lock.statements[:5]
    assert rig.lock.checkouts == 0, "the lock connection is held, never checked out again"
    # The database-up ping: one pooled checkout and one statement.
    assert len(rig.main.statements) == CHECKS, rig.main.statements[:5]
    assert rig.main.checkouts == CHECKS

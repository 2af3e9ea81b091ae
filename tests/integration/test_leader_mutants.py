"""The leader lock's reports and edges, pinned whole (``detector/app/leader.py`` under
mutation, benchmarks/results/mutation.md). What an operator reads (every log line, every problem's reason), what
the remediation is handed (the fence's term, end, clock, key and lock backend), the exact instants a
fence starts and a takeover wait ends, that ``release`` frees the lock itself before closing its
connection, how long the server lets a silent transaction lock live, and when a silent holder is
called unresponsive. Real PostgreSQL (and a real PgBouncer for the refusal)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError
from structlog.testing import capture_logs

from detector.app.leader import (
    LEADER_UNRESPONSIVE,
    LOCK_REFUSED,
    LOCK_UNAVAILABLE,
    STANDBY_PROBLEM,
    AdvisoryLock,
    LockProblem,
)
from detector.metadb import leader_lock
from detector.metadb.engine import make_engine, parse_url, redact
from tests.integration.test_leader import EXIT_WAIT_MS, _Clock
from tests.pg import Templates
from tests.pgbouncer import pgbouncer

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)
KEY = 4243
MODES = pytest.mark.parametrize("mode", ["session", "transaction"])
NOW = datetime.now(UTC)  # unused by the lock (its lease runs on the monotonic clock), passed as callers do


@pytest.fixture(scope="module")
def url(pg_templates: Templates) -> str:
    """One database for the module (a clone per test made most of its time under mutation, where it
    runs once per mutant): every test releases what it took, so each starts with the lock free."""
    return pg_templates.clone("3.1.2")


def _lock(url: str, mode: str | None = None, **kwargs: Any) -> AdvisoryLock:
    engine = make_engine(parse_url(url), pool_size=1)
    kwargs.setdefault("lease", LEASE)
    return AdvisoryLock(engine, KEY, **kwargs) if mode is None else AdvisoryLock(engine, KEY, mode=mode, **kwargs)


def _granted(url: str, pid: int) -> bool:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            return leader_lock.advisory_lock_granted_to(conn, KEY, pid)
    finally:
        engine.dispose()


def _on_server(url: str, sql: str, **params: Any) -> Any:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql), params)
            value = result.scalar() if result.returns_rows else None
            conn.commit()
            return value
    finally:
        engine.dispose()


def _terminate(url: str, pid: int) -> None:
    """End the lock's backend and return once it has exited (its locks released)."""
    assert _on_server(url, "SELECT pg_terminate_backend(:p, :ms)", p=pid, ms=EXIT_WAIT_MS) is True


def _fence_pid(lock: AdvisoryLock) -> int:
    fence = lock.fence()
    assert fence is not None and fence.backend_pid is not None
    return fence.backend_pid


def _entries(logs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "logger_name"} for e in logs]


@pytest.mark.parametrize(("mode", "kind"), [(None, "session"), ("session", "session"), ("transaction", "transaction")])
def test_acquisition_waiting_and_release_are_logged_whole(url: str, mode: str | None, kind: str) -> None:
    """Each term logs which lock it took, in which mode (``auto`` by default) and its term number,
    then how long it waits before its first write (to the hundredth, also under a second) and why,
    and nothing about waiting when it does not wait; a release names the key. A later term has
    a later number, and the fence carries it. A replica that never led logs no release."""
    first, second = _lock(url, mode, takeover_wait=timedelta(seconds=0.456)), _lock(url, mode)
    try:
        assert first.problem is None and first.waiting() is None and first.fence() is None  # never led
        with capture_logs() as logs:
            assert first.ensure(NOW) is True
            term = first.term
            assert second.ensure(NOW) is False
            second.release()  # holds nothing: nothing to log
            first.release()
            assert second.ensure(NOW) is True
        fence = second.fence()
        assert second.term > term and fence is not None and fence.term == second.term
        expected_mode = mode or "auto"
        assert _entries(logs) == [
            {"event": "leader_acquired", "lock_key": KEY, "lock": kind, "mode": expected_mode, "term": term,
             "log_level": "info"},
            {"event": "leader_waiting_to_act", "seconds": 0.46, "reason": "the previous leader's writes may still land",
             "log_level": "info"},
            {"event": "leader_released", "lock_key": KEY, "log_level": "info"},
            {"event": "leader_acquired", "lock_key": KEY, "lock": kind, "mode": expected_mode, "term": second.term,
             "log_level": "info"},
        ]  # fmt: skip
        assert first.problem is None and second.problem is None
    finally:
        first.release()
        second.release()


@MODES
def test_release_frees_the_lock_before_closing_its_connection(url: str, mode: str) -> None:
    """A close frees the lock only once the server has noticed it; ``release`` unlocks first (the
    session lock by ``pg_advisory_unlock``, the transaction lock by ending its transaction), so at the
    moment the connection is closed the lock is already free for the standby's very next attempt."""
    lock = _lock(url, mode)
    held_at_close: list[bool] = []
    try:
        assert lock.ensure(NOW) is True
        pid = _fence_pid(lock)
        event.listen(lock.engine, "invalidate", lambda *args: held_at_close.append(_granted(url, pid)))
        assert _granted(url, pid)
        lock.release()
        assert held_at_close == [False]
    finally:
        lock.release()


@MODES
def test_the_fence_is_the_lease_of_this_term_on_the_lock_backend(url: str, mode: str) -> None:
    """The fence names this term, the lock backend that holds the lock, the key, and ends exactly one
    lease after the heartbeat's send, on the lock's own clock."""
    clock = _Clock()
    lock = _lock(url, mode, clock=clock)
    try:
        assert lock.ensure(NOW) is True
        fence = lock.fence()
        assert fence is not None
        assert (fence.term, fence.ends, fence.key) == (lock.term, 1003.0, KEY)
        assert fence.backend_pid is not None and _granted(url, fence.backend_pid)
        clock.now = 1002.5
        assert fence.valid() and fence.remaining() == 0.5  # the lock's clock, not time.monotonic
        clock.now = 1003.0
        assert not fence.valid() and lock.fence() is None
    finally:
        lock.release()


def test_the_takeover_wait_ends_at_its_exact_instant(url: str) -> None:
    """``waiting()`` counts down to the instant the first write is allowed; from that very instant it
    is None and the fence is granted. A replica that loses the lock while waiting waits for nothing."""
    clock = _Clock()
    lock = _lock(url, "session", takeover_wait=timedelta(seconds=5), clock=clock)
    try:
        assert lock.ensure(NOW) is True  # at 1000.0: acts from 1005.0
        clock.now = 1004.0
        assert lock.ensure(NOW) is True  # heartbeat: the lease now ends at 1007.0
        clock.now = 1004.5
        assert lock.waiting() == 0.5 and lock.fence() is None
        clock.now = 1005.0
        fence = lock.fence()
        assert lock.waiting() is None and fence is not None and fence.ends == 1007.0
        clock.now = 1000.0  # a new term's wait, then the lock backend ends within it
        lock.release()
        assert lock.ensure(NOW) is True and lock.waiting() == 5.0
        _terminate(url, _lock_backend(url))
        assert lock.ensure(NOW) is False
        assert lock.waiting() is None and lock.fence() is None and not lock.is_leader()
    finally:
        lock.release()


def _lock_backend(url: str) -> int:
    """The backend granted the key (while the fence, which names it too, is withheld: takeover wait)."""
    pid = _on_server(
        url,
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = :k "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        k=KEY,
    )
    assert isinstance(pid, int)
    return pid


@MODES
def test_a_lost_lock_backend_is_logged_and_reported_whole(url: str, mode: str) -> None:
    """The heartbeat after the lock backend was terminated logs ``leader_lost`` with the driver's first
    line, and the problem says the lock check failed, in those words; a second attempt on the way back
    does not log the same problem again."""
    lock = _lock(url, mode)
    try:
        assert lock.ensure(NOW) is True
        _terminate(url, _fence_pid(lock))
        with capture_logs() as logs:
            assert lock.ensure(NOW) is False
        reason = f"database {redact(lock.engine.url)}: FATAL:  terminating connection due to administrator command"
        problem = LockProblem(LOCK_UNAVAILABLE, f"the lock check failed: {reason}")
        assert lock.problem == problem
        assert _entries(logs) == [
            {"event": "leader_lost", "reason": reason, "log_level": "warning"},
            {"event": "leader_lock_problem", "problem": problem.code, "reason": problem.reason, "log_level": "debug"},
        ]
    finally:
        lock.release()


@MODES
def test_a_release_after_the_lock_backend_died_neither_raises_nor_leads(url: str, mode: str) -> None:
    """Shutting down after the lock's backend was terminated (before any heartbeat noticed): the unlock
    or rollback fails on the dead connection, ``release`` still returns, logs the release and leaves
    this replica not leading, and the lock free."""
    lock = _lock(url, mode)
    try:
        assert lock.ensure(NOW) is True
        pid = _fence_pid(lock)
        _terminate(url, pid)
        with capture_logs() as logs:
            lock.release()
        assert _entries(logs) == [{"event": "leader_released", "lock_key": KEY, "log_level": "info"}]
        assert not lock.is_leader() and lock.fence() is None and not _granted(url, pid)
    finally:
        lock.release()


@pytest.mark.parametrize("mode", ["session", "transaction"])  # each lock's heartbeat asks on its own
def test_a_lock_server_in_recovery_is_reported_in_the_standby_words(
    url: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A heartbeat, then every reconnect, that finds the server in recovery (a live server cannot be
    demoted: the answer is patched after a real acquisition, as test_standby.py does; a real standby is
    tested there) ends leadership with the standby problem, logged once, and never leads again."""
    lock = _lock(url, mode)
    try:
        assert lock.ensure(NOW) is True
        monkeypatch.setattr(leader_lock, "in_recovery", lambda conn: True)
        monkeypatch.setattr(
            leader_lock, "session_lock_status", lambda conn, key, pid: (True, True, True)
        )  # the heartbeat
        with capture_logs() as logs:
            for _ in range(3):
                assert lock.ensure(NOW) is False
        assert lock.problem == STANDBY_PROBLEM and not lock.is_leader()
        assert _entries(logs) == [
            {"event": "leader_lost", "reason": f"database {redact(lock.engine.url)}: {STANDBY_PROBLEM.reason}",
             "log_level": "warning"},
            {"event": "leader_lock_problem", "problem": STANDBY_PROBLEM.code, "reason": STANDBY_PROBLEM.reason,
             "log_level": "debug"},
        ]  # fmt: skip
    finally:
        lock.release()


def _other_backends(url: str) -> int:
    """Server connections to this database but the one counting them."""
    sql = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    return int(_on_server(url, sql))


def test_a_standby_leaves_no_connection_open_once_it_stops_or_an_attempt_fails(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby keeps one connection between its attempts and closes it when it stops; an
    attempt that fails while classifying its connection (here the recovery check, made to fail) closes
    that one too: none is left open, nor pooled for the next attempt. (Waits: the server ends a
    closed connection's backend a moment after the client closed it.)"""
    holder, standby = _lock(url, "session"), _lock(url, "session")
    try:
        assert holder.ensure(NOW) is True
        _wait(lambda: _other_backends(url) == 1, "the holder's connection alone")
        assert standby.ensure(NOW) is False
        _wait(lambda: _other_backends(url) == 2, "the holder's and the standby's kept connection")
        standby.release()
        _wait(lambda: _other_backends(url) == 1, "the stopped standby's connection closed")

        def broken(conn: Any) -> bool:
            raise OperationalError("SELECT pg_is_in_recovery()", {}, Exception("server closed the connection"))

        monkeypatch.setattr(leader_lock, "in_recovery", broken)
        assert standby.ensure(NOW) is False
        assert standby.problem == LockProblem(
            LOCK_UNAVAILABLE, f"database {redact(standby.engine.url)}: server closed the connection"
        )
        _wait(lambda: _other_backends(url) == 1, "the failed attempt's connection closed")
    finally:
        holder.release()
        standby.release()


def test_an_unreachable_lock_database_is_reported_whole_and_once() -> None:
    """A lock attempt that cannot connect reports the redacted URL and the driver's words, logs the
    problem once while it lasts, and never leads."""
    unreachable = "postgresql://dupguard:s3cret-pw@127.0.0.1:1/airflow"
    lock = _lock(unreachable)
    with capture_logs() as logs:
        assert lock.ensure(NOW) is False
        assert lock.ensure(NOW) is False
    problem = LockProblem(
        LOCK_UNAVAILABLE, "database postgresql+psycopg2://dupguard:***@127.0.0.1:1/airflow: Connection refused"
    )
    assert lock.problem == problem and not lock.is_leader()
    assert _entries(logs) == [
        {"event": "leader_lock_problem", "problem": problem.code, "reason": problem.reason, "log_level": "debug"}
    ]


def test_session_mode_refuses_a_pooled_session_in_these_words(url: str) -> None:
    """Through PgBouncer's transaction pooling ``session`` refuses, and says why and what to set."""
    with pgbouncer(url, "transaction") as pooled:
        lock = _lock(pooled, "session")
        try:
            for _ in range(2):  # and again on the next attempt
                assert lock.ensure(NOW) is False and not lock.is_leader()
            assert lock.problem == LockProblem(
                LOCK_REFUSED,
                "the leader-lock connection is not pinned to one server session (a pooler in transaction or "
                "statement pooling, e.g. PgBouncer), where a session lock can be shared by two replicas: set "
                "DUPGUARD_LOCK_MODE=auto (or transaction), or DUPGUARD_LOCK_DATABASE_URL to a direct URL",
            )
        finally:
            lock.release()


def _wait(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_server_frees_a_silent_transaction_lock_after_two_leases(url: str) -> None:
    """The transaction lock's own ``idle_in_transaction_session_timeout`` is twice the lease (for that
    transaction only): a leader that went silent loses its lock on the server, after it has stopped
    acting (its lease ended first), and learns so at its next heartbeat."""
    lock = _lock(url, "transaction", lease=timedelta(milliseconds=500))
    try:
        assert lock.ensure(NOW) is True
        assert lock._conn is not None  # the lock's own transaction: where the setting lives
        assert lock._conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar() == "1s"
        pid = _fence_pid(lock)
        _wait(lambda: not _granted(url, pid), "the server to end the silent lock's session")
        assert lock.ensure(NOW) is False and lock.problem is not None
        assert lock.problem.code == LOCK_UNAVAILABLE
    finally:
        lock.release()


@MODES
def test_a_leader_keeps_its_lock_under_a_short_database_idle_in_transaction_timeout(url: str, mode: str) -> None:
    """A database whose own ``idle_in_transaction_session_timeout`` is short ends sessions idle inside a
    transaction. The session lock's connection is in autocommit (idle between heartbeats, in no
    transaction), and the transaction lock sets its own timeout of two leases: both keep the lock
    across a pause longer than the database's timeout."""
    name = parse_url(url).database
    _on_server(url, f"ALTER DATABASE \"{name}\" SET idle_in_transaction_session_timeout = '500ms'")
    lock = _lock(url, mode)
    try:
        assert lock.ensure(NOW) is True
        time.sleep(2.0)  # four times the database's timeout, within the lease
        assert lock.ensure(NOW) is True, lock.problem
        assert _granted(url, _fence_pid(lock))
    finally:
        lock.release()
        _on_server(url, f'ALTER DATABASE "{name}" RESET idle_in_transaction_session_timeout')


SILENT = re.compile(r"the lock holder's backend has been silent for (\d+)s \(stalled or cut off\)")


def _holder_idle(url: str) -> float:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            idle = leader_lock.advisory_lock_holder_idle(conn, KEY)
    finally:
        engine.dispose()
    assert idle is not None
    return idle


@MODES
def test_a_holder_silent_for_more_than_three_leases_is_unresponsive(url: str, mode: str) -> None:
    """A standby that finds the lock taken reports the holder unresponsive once the holder's backend
    has been silent for more than three of the standby's leases, with the seconds; a holder that
    heartbeats again clears it. (Standby lease 0.4 s: unresponsive past 1.2 s of silence.)"""
    holder, standby = _lock(url, mode), _lock(url, mode, lease=timedelta(milliseconds=400))
    try:
        assert holder.ensure(NOW) is True
        assert standby.ensure(NOW) is False and standby.problem is None  # just heartbeated: alive
        _wait(lambda: _holder_idle(url) > 1.25, "the holder to be silent for 1.25 s")
        silent_for = _holder_idle(url)
        assert standby.ensure(NOW) is False
        problem = standby.problem
        assert problem is not None and problem.code == LEADER_UNRESPONSIVE
        match = SILENT.fullmatch(problem.reason)
        assert match is not None, problem.reason
        assert int(match.group(1)) >= round(silent_for)
        assert holder.ensure(NOW) is True
        assert standby.ensure(NOW) is False and standby.problem is None
    finally:
        holder.release()
        standby.release()


FAILING = "dupguard_failing_idle_read"  # a schema whose pg_stat_activity raises when read


def _schema_first(url: str, schema: str, ddl: str) -> Iterator[str]:
    """``url`` whose connections look names up first in ``schema`` (made by ``ddl``; dropped after)."""
    _on_server(url, f"CREATE SCHEMA {schema}; {ddl}")
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}%2Cpg_catalog%2Cpublic"
    finally:
        _on_server(url, f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture(scope="module")
def failing_idle_read_url(url: str) -> Iterator[str]:
    """The module's database through a URL whose connections look ``pg_stat_activity`` up first in a
    schema where reading it raises (``options=-csearch_path``, those connections only): there the
    holder's idle read fails in the server, right after the lock statement (which reads only
    ``pg_locks`` and ``pg_database``), as a connection failing between the two would make it fail."""
    yield from _schema_first(
        url,
        FAILING,
        f"CREATE FUNCTION {FAILING}.fail() RETURNS boolean LANGUAGE plpgsql "
        "AS $$ BEGIN RAISE EXCEPTION 'the idle read failed'; END $$; "
        f"CREATE VIEW {FAILING}.pg_stat_activity AS "
        f"SELECT pid, state_change FROM pg_catalog.pg_stat_activity WHERE {FAILING}.fail()",
    )


@MODES
def test_a_granted_lock_leads_though_the_holders_idle_read_would_fail(
    url: str, failing_idle_read_url: str, mode: str
) -> None:
    """The holder's idle time is read only when another holder has the lock: a granted lock leads
    whatever that read would do. On these connections it fails (a standby there shows it: the failure
    is its lock_unavailable); a lock granted there leads, and heartbeats on. Read also when granted
    (mutant ``_try_acquire`` ``_23``), the failure cost the lock just taken: lock_unavailable, no leader."""
    holder, standby = _lock(url, mode), _lock(failing_idle_read_url, mode)
    try:
        assert holder.ensure(NOW) is True
        assert standby.ensure(NOW) is False
        problem = standby.problem
        assert problem is not None and problem.code == LOCK_UNAVAILABLE and "the idle read failed" in problem.reason
        holder.release()
        assert standby.ensure(NOW) is True, standby.problem
        assert standby.problem is None and _granted(url, _fence_pid(standby))
        assert standby.ensure(NOW) is True
    finally:
        holder.release()
        standby.release()


FIXED = "dupguard_fixed_idle"  # a schema whose clock_timestamp() is fixed and pg_stat_activity's state_change set
FIXED_NOW = "2026-01-01 00:00:03+00"


@pytest.fixture(scope="module")
def fixed_idle_url(url: str) -> Iterator[str]:
    """The module's database through a URL whose connections read the holder's idle time from a fixed
    clock and a ``state_change`` kept in a table of ``FIXED`` (both looked up first in that schema there,
    ``options=-csearch_path``): an idle time to the microsecond, which the live server never gives."""
    yield from _schema_first(
        url,
        FIXED,
        f"CREATE FUNCTION {FIXED}.clock_timestamp() RETURNS timestamptz LANGUAGE sql "
        f"AS $$ SELECT timestamptz '{FIXED_NOW}' $$; "
        f"CREATE TABLE {FIXED}.state (change timestamptz NOT NULL); "
        f"INSERT INTO {FIXED}.state VALUES (timestamptz '{FIXED_NOW}'); "
        f"CREATE VIEW {FIXED}.pg_stat_activity AS "
        f"SELECT a.pid, s.change AS state_change FROM pg_catalog.pg_stat_activity a, {FIXED}.state s",
    )


@MODES
def test_a_holder_silent_for_exactly_three_leases_is_not_yet_unresponsive(
    url: str, fixed_idle_url: str, mode: str
) -> None:
    """Unresponsive means silent for more than three of the standby's leases: at exactly three (1 s
    lease, the holder's backend silent for 3.000000 s) the standby reports nothing, a microsecond more
    and it reports the holder unresponsive. (``>=`` for ``>``, mutant ``_try_acquire`` ``_52``: at three.)"""
    holder, standby = _lock(url, mode), _lock(fixed_idle_url, mode, lease=timedelta(seconds=1))
    try:
        assert holder.ensure(NOW) is True
        _on_server(url, f"UPDATE {FIXED}.state SET change = timestamptz '{FIXED_NOW}' - interval '3 seconds'")
        assert standby.ensure(NOW) is False and standby.problem is None
        _on_server(url, f"UPDATE {FIXED}.state SET change = timestamptz '{FIXED_NOW}' - interval '3.000001 seconds'")
        assert standby.ensure(NOW) is False
        assert standby.problem is not None and standby.problem.code == LEADER_UNRESPONSIVE, standby.problem
        assert SILENT.fullmatch(standby.problem.reason) is not None and "for 3s" in standby.problem.reason
    finally:
        holder.release()
        standby.release()

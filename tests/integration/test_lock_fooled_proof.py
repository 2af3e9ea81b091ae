"""A fooled pinning proof never gives two leaders (the gap after the proof).

``auto`` takes a session lock only when ``is_pinned`` proves the lock connection stays on one server
session. The proof is probabilistic: behind PgBouncer's transaction pooling a busy neighbour can make
it pass (test_lock_pinning's busy-neighbour case failed once in CI). A session lock then sits on a
pooled server session B, where advisory locks are re-entrant for whichever client lands on B, a lost B
went unnoticed by a heartbeat landing elsewhere, and an unlock landing elsewhere left the lock on B.

Here the proof's verdict is forced to "pinned" (``detector.app.leader.is_pinned`` patched) behind a
real PgBouncer in transaction pooling: that stands for a fooled proof, deterministically. Real
PostgreSQL and PgBouncer otherwise; the server sessions are steered with PgBouncer's own rules (a
client in an open transaction keeps its server session; a pool of one has one server session)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from structlog.testing import capture_logs

from detector.app import leader
from detector.app.leader import LOCK_POOLED, LOCK_REFUSED, AdvisoryLock
from detector.config import SETTINGS_BY_NAME
from detector.metadb import leader_lock
from detector.metadb.engine import make_engine, parse_url
from tests.integration.test_leader import EXIT_WAIT_MS
from tests.pg import Templates
from tests.pgbouncer import pgbouncer

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)
KEY = int(SETTINGS_BY_NAME["lock_key"].default)  # above 2**32: classid and objid both used in pg_locks
NOW = datetime.now(UTC)


@pytest.fixture
def db_url(pg_templates: Templates, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(leader, "is_pinned", lambda conn: True)  # the fooled proof (module docstring)
    return pg_templates.clone("3.1.2")


def _lock(url: str) -> AdvisoryLock:
    return AdvisoryLock(make_engine(parse_url(url), pool_size=1), KEY, mode="auto", lease=LEASE)


def _holders(direct: str) -> list[int]:
    """The backends granted the key in this database, read on a direct connection."""
    engine = make_engine(parse_url(direct))
    try:
        with engine.connect() as conn:
            pids = conn.exec_driver_sql(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                "AND classid = %(hi)s::oid AND objid = %(lo)s::oid "
                "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                {"hi": KEY >> 32, "lo": KEY & 0xFFFFFFFF},
            )
            return sorted(int(p) for (p,) in pids)
    finally:
        engine.dispose()


def _terminate(direct: str, pid: int) -> None:
    conn = psycopg2.connect(direct)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s, %s)", (pid, EXIT_WAIT_MS))
            assert cur.fetchone() == (True,), "the lock's server session gone before the next ensure"
    finally:
        conn.close()


def _pid(lock: AdvisoryLock) -> int:
    fence = lock.fence()
    assert fence is not None and fence.backend_pid is not None
    return fence.backend_pid


def _problem_code(lock: AdvisoryLock) -> str | None:
    return None if lock.problem is None else lock.problem.code


@contextmanager
def occupying(pooled: str, pid: int) -> Iterator[None]:
    """Keep server session ``pid`` busy in another client's open transaction, so that nothing else
    runs there meanwhile (PgBouncer gives a server session to one client transaction at a time). Opens
    clients in open transactions until one lands on ``pid``, then lets the others go."""
    clients: list[psycopg2.extensions.connection] = []
    try:
        for _ in range(10):
            client = psycopg2.connect(pooled)
            clients.append(client)
            with client.cursor() as cur:
                cur.execute("SELECT pg_backend_pid()")  # opens its transaction (no autocommit)
                row = cur.fetchone()
            if row is not None and row[0] == pid:
                break
        else:
            raise AssertionError(f"no client landed on server session {pid}")
        for other in clients[:-1]:
            other.rollback()
        yield
    finally:
        for client in clients:  # end the transaction first: PgBouncer closes a server left mid-transaction
            with suppress(psycopg2.Error):
                client.rollback()
            client.close()


def test_a_replica_on_the_holders_server_session_does_not_lead(db_url: str) -> None:
    """Pool of one: every client's statements run on the one server session. A (proof fooled) takes
    the session lock there; B's attempt runs on that same session, where ``pg_try_advisory_lock`` would
    be granted (re-entrant per backend): B must not lead, reports lock_pooled naming the settings, and
    from then on takes the transaction lock (no longer trusting its proof), which is refused there
    too. After A's release B leads, on the transaction lock. (Before: B led beside A.)"""
    with pgbouncer(db_url, "transaction", pool_size=1) as pooled:
        a, b = _lock(pooled), _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            with capture_logs() as logs:
                for _ in range(3):
                    assert b.ensure(NOW) is False, "two leaders"
                    assert a.ensure(NOW) is True
            assert b.problem is not None and b.problem.code == LOCK_POOLED, b.problem
            assert "DUPGUARD_LOCK_MODE=transaction" in b.problem.reason
            assert "DUPGUARD_LOCK_DATABASE_URL" in b.problem.reason
            warnings = [e for e in logs if e["log_level"] == "warning"]
            assert [e["event"] for e in warnings] == ["leader_lock_pooled"], warnings
            assert _holders(db_url) == [_pid(a)]
            a.release()
            assert _holders(db_url) == [], "the unlock ran on the one server session"
            assert b.ensure(NOW) is True and b.lock_kind == "transaction"
            assert _holders(db_url) == [_pid(b)]  # (A's next attempt would wait: B's transaction holds the pool)
        finally:
            a.release()
            b.release()


def test_a_lost_server_session_ends_leadership_and_never_two_lead(db_url: str) -> None:
    """Pool of two: A leads on server session S; S is terminated (what a pooler's recycling or
    ``pg_terminate_backend`` does), which frees the lock. A's next heartbeat runs on the other server
    session and must find the lock no longer granted to S: leadership lost, as with a lost connection.
    Then the two replicas contend for dozens of rounds: never both leading, one leading in the end.
    (Before: A's heartbeat succeeded elsewhere and A led on beside the new holder.)"""
    with pgbouncer(db_url, "transaction", pool_size=2) as pooled:
        a, c = _lock(pooled), _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            _terminate(db_url, _pid(a))
            assert a.ensure(NOW) is False and not a.is_leader()
            assert a.problem is not None
            leaders: list[tuple[bool, bool]] = []
            for _ in range(30):
                a.ensure(NOW)
                c.ensure(NOW)
                leaders.append((a.is_leader(), c.is_leader()))
            assert (True, True) not in leaders, leaders
            assert leaders[-1] in ((True, False), (False, True)), leaders
            assert len(_holders(db_url)) == 1
        finally:
            a.release()
            c.release()


def test_a_heartbeat_that_ran_elsewhere_reports_and_keeps_verifying(db_url: str) -> None:
    """A leads on server session S; another client holds S in an open transaction, so A's heartbeats
    run on the other server session. The lock is still granted to S, hence exclusive (no replica can
    re-enter it from S now): A goes on leading, reports lock_pooled with one warning, and every
    heartbeat re-verifies S: once S is gone, the next one ends leadership."""
    with pgbouncer(db_url, "transaction", pool_size=2) as pooled:
        a = _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session" and a.problem is None
            pid = _pid(a)
            with occupying(pooled, pid), capture_logs() as logs:
                for _ in range(3):
                    assert a.ensure(NOW) is True, a.problem
                    assert _problem_code(a) == LOCK_POOLED
                    assert _pid(a) == pid and _holders(db_url) == [pid]
                _terminate(db_url, pid)
                assert a.ensure(NOW) is False and not a.is_leader()
            warnings = [e["event"] for e in logs if e["log_level"] == "warning"]
            assert warnings == ["leader_lock_pooled", "leader_lost"], warnings
            assert "DUPGUARD_LOCK_MODE=transaction" in str(logs[0])
        finally:
            a.release()


def test_a_release_that_cannot_reach_the_lock_session_leaves_it_there_and_says_so(db_url: str) -> None:
    """A leads on server session S, and S is busy with another client when A releases: an unlock sent
    elsewhere would do nothing (the lock stays on S) and one landing on S would free it, so release
    sends a few unlocks guarded by S's pid, none runs on S, and it warns that the lock stays on that
    server session until the pooler closes it. No replica leads meanwhile (exclusive still); once S
    ends, a standby takes the lock."""
    with pgbouncer(db_url, "transaction", pool_size=2) as pooled:
        a, c = _lock(pooled), _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            pid = _pid(a)
            with occupying(pooled, pid):
                with capture_logs() as logs:
                    a.release()
                assert not a.is_leader() and _holders(db_url) == [pid]
                left = [e for e in logs if e["event"] == "leader_lock_left_on_server_session"]
                assert len(left) == 1 and left[0]["log_level"] == "warning", logs
                assert left[0]["backend_pid"] == pid
                assert left[0]["reason"] == (  # word for word (mutation run of 735cccb: the texts survived)
                    f"the release's unlocks ran on other server sessions: the leader lock stays on backend pid {pid} "
                    "until the pooler closes that server connection (PgBouncer: server_lifetime, RECONNECT, a "
                    "restart); no replica leads meanwhile. a pooler in transaction or statement pooling (e.g. "
                    "PgBouncer) shares server sessions between clients, and the pinning proof was fooled. Set "
                    "DUPGUARD_LOCK_MODE=transaction, or DUPGUARD_LOCK_DATABASE_URL to a direct URL"
                )
                assert c.ensure(NOW) is False
            assert c.ensure(NOW) is False, "S is free again but still holds the lock"
            _terminate(db_url, pid)
            assert c.ensure(NOW) is True
        finally:
            a.release()
            c.release()


def test_a_release_that_reaches_the_lock_session_frees_it(db_url: str) -> None:
    """Nothing in the way: the guarded unlock runs on S (PgBouncer hands the most recently used server
    session out first, and it is idle) and frees the lock; no warning."""
    with pgbouncer(db_url, "transaction", pool_size=1) as pooled:
        a = _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            with capture_logs() as logs:
                a.release()
            assert _holders(db_url) == []
            assert [e["event"] for e in logs] == ["leader_released"]
        finally:
            a.release()


def test_a_pooled_session_lock_held_by_another_replica_refuses_the_transaction_lock(db_url: str) -> None:
    """DUPGUARD_LOCK_MODE=transaction beside a replica whose fooled proof put a session lock on the
    pool's one server session: the transaction lock's attempt runs there too, where
    ``pg_try_advisory_xact_lock`` would be granted (re-entrant across levels): refused, lock_pooled."""
    with pgbouncer(db_url, "transaction", pool_size=1) as pooled:
        a = _lock(pooled)
        t = AdvisoryLock(make_engine(parse_url(pooled), pool_size=1), KEY, mode="transaction", lease=LEASE)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            assert t.ensure(NOW) is False, "two leaders"
            assert _problem_code(t) == LOCK_POOLED
            assert _holders(db_url) == [_pid(a)]
        finally:
            a.release()
            t.release()


def test_a_direct_session_lock_heartbeats_on_its_own_backend(db_url: str) -> None:
    """No pooler: the session lock's heartbeat runs on the lock's backend and finds the lock there
    (one statement), with no problem; leader_lock.session_lock_status says so."""
    a = _lock(db_url)
    try:
        assert a.ensure(NOW) is True and a.lock_kind == "session"
        for _ in range(3):
            assert a.ensure(NOW) is True and a.problem is None
        assert a._conn is not None
        assert leader_lock.session_lock_status(a._conn, KEY, _pid(a)) == (False, True, True)
        assert leader_lock.session_lock_status(a._conn, KEY, _pid(a) + 1) == (False, False, False)
    finally:
        a.release()


def test_session_mode_refuses_once_a_pooler_was_seen(db_url: str) -> None:
    """DUPGUARD_LOCK_MODE=session, proof fooled, attempt on the holder's server session: lock_pooled,
    and from the next attempt the usual refusal (no proof is trusted again in this process)."""
    with pgbouncer(db_url, "transaction", pool_size=1) as pooled:
        a = _lock(pooled)
        s = AdvisoryLock(make_engine(parse_url(pooled), pool_size=1), KEY, mode="session", lease=LEASE)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            assert s.ensure(NOW) is False and _problem_code(s) == LOCK_POOLED
            assert s.ensure(NOW) is False and _problem_code(s) == LOCK_REFUSED
            a.release()
            assert s.ensure(NOW) is False and _problem_code(s) == LOCK_REFUSED, "refused even with the lock free"
        finally:
            a.release()
            s.release()


POOLED_LEADER = (
    "the leader lock's heartbeat ran on another server session than the one holding its session lock "
    "(backend pid {pid}): a pooler in transaction or statement pooling (e.g. PgBouncer) shares server sessions "
    "between clients, and the pinning proof was fooled. Set DUPGUARD_LOCK_MODE=transaction, or "
    "DUPGUARD_LOCK_DATABASE_URL to a direct URL. The lock is still granted to that session, so no other replica "
    "can take it: this replica leads on while every heartbeat checks that, but it may not reach that session "
    "to release the lock, which then stays there until the pooler closes the server connection"
)


def test_a_heartbeat_elsewhere_is_said_whole_and_the_next_term_takes_the_transaction_lock(db_url: str) -> None:
    """What the operator reads, word for word (mutation run of 735cccb: the texts, the pid, ``leading``
    survived), and what the replica remembers: once a heartbeat ran on another server session, its next
    term (auto) takes the transaction lock, even though the (fooled) proof still says pinned."""
    with pgbouncer(db_url, "transaction", pool_size=2) as pooled:
        a = _lock(pooled)
        try:
            assert a.ensure(NOW) is True and a.lock_kind == "session"
            pid = _pid(a)
            with occupying(pooled, pid), capture_logs() as logs:
                assert a.ensure(NOW) is True
                assert a.problem is not None and a.problem.reason == POOLED_LEADER.format(pid=pid)
                _terminate(db_url, pid)
                assert a.ensure(NOW) is False
            pooled_line, lost = [e for e in logs if e["log_level"] == "warning"]
            assert pooled_line == {
                "event": "leader_lock_pooled",
                "log_level": "warning",
                "logger_name": "dupguard.leader",
                "leading": True,
                "reason": POOLED_LEADER.format(pid=pid),
            }
            assert lost["event"] == "leader_lost"
            assert lost["reason"].endswith(
                f": the session lock is no longer granted to its server session (backend pid {pid}): that "
                "session ended (terminated, or closed by a pooler) or the lock was released there"
            ), lost
            assert a.ensure(NOW) is True and a.lock_kind == "transaction"
        finally:
            a.release()


def test_a_refused_attempt_on_the_holders_session_warns_as_not_leading(db_url: str) -> None:
    with pgbouncer(db_url, "transaction", pool_size=1) as pooled:
        a, b = _lock(pooled), _lock(pooled)
        try:
            assert a.ensure(NOW) is True
            with capture_logs() as logs:
                assert b.ensure(NOW) is False
            assert logs == [
                {
                    "event": "leader_lock_pooled",
                    "log_level": "warning",
                    "logger_name": "dupguard.leader",
                    "leading": False,
                    "reason": leader.POOLED_ATTEMPT.reason,
                }
            ]
        finally:
            a.release()
            b.release()


def test_a_session_lock_heartbeat_on_a_server_now_in_recovery_ends_leadership(db_url: str) -> None:
    """The session lock heartbeat's recovery check, in its one statement: a real PostgreSQL whose
    ``pg_is_in_recovery()`` answers true to the lock's connection (a function of that name in ``public``,
    searched first on that connection only) stands for a server that became a standby (test_standby.py
    has a real replica, out of the mutation selection). Leadership ends with lock_on_standby, and the
    lost line says why."""
    a = _lock(db_url)
    try:
        assert a.ensure(NOW) is True and a.lock_kind == "session"
        setup = psycopg2.connect(db_url)
        setup.autocommit = True
        try:
            with setup.cursor() as cur:
                cur.execute("CREATE FUNCTION public.pg_is_in_recovery() RETURNS boolean LANGUAGE sql AS 'SELECT true'")
        finally:
            setup.close()
        assert a._conn is not None
        a._conn.exec_driver_sql("SET search_path = public, pg_catalog")
        with capture_logs() as logs:
            assert a.ensure(NOW) is False and not a.is_leader()
        assert _problem_code(a) == leader.LOCK_ON_STANDBY
        (lost,) = [e for e in logs if e["event"] == "leader_lost"]
        assert lost["reason"].endswith(leader.STANDBY_PROBLEM.reason), lost
    finally:
        a.release()

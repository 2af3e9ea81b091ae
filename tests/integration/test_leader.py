"""Leader lock on real PostgreSQL, in both modes: one holder at a time, release hands it over,
a lost connection ends leadership at once, and the lease stops a leader whose heartbeat is stale."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg2
import pytest
from sqlalchemy import text

from detector.app.leader import AdvisoryLock
from detector.metadb.engine import make_engine, parse_url
from tests.pg import Templates

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)
# pg_terminate_backend(pid) only signals the backend: a check right after it could still see the lock
# held on a loaded machine (flaky under mutmut). With a timeout it returns once the backend has exited,
# after it released its locks (true), or false when it is still there after this many ms.
EXIT_WAIT_MS = 30_000


def _lock(url: str, mode: str) -> AdvisoryLock:
    return AdvisoryLock(make_engine(parse_url(url), pool_size=1), 4242, mode=mode, lease=LEASE)


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_one_holder_and_handover(mode: str, pg_templates: Templates) -> None:
    """Only one of two contenders holds the lock; releasing it lets the other take it."""
    url = pg_templates.clone("3.1.2")
    now = datetime.now(UTC)
    a, b = _lock(url, mode), _lock(url, mode)
    try:
        assert a.ensure(now) is True
        assert b.ensure(now) is False
        assert a.ensure(now) is True  # heartbeat keeps it
        a.release()
        assert b.ensure(now) is True
        assert a.ensure(now) is False
    finally:
        a.release()
        b.release()


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_terminated_backend_ends_leadership_and_frees_lock(mode: str, pg_templates: Templates) -> None:
    """When the lock's backend dies, the holder notices at its next heartbeat and the lock is free."""
    url = pg_templates.clone("3.1.2")
    now = datetime.now(UTC)
    a, b = _lock(url, mode), _lock(url, mode)
    try:
        assert a.ensure(now)
        admin = psycopg2.connect(url)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute(
                f"SELECT pg_terminate_backend(pid, {EXIT_WAIT_MS}) FROM pg_locks WHERE locktype = 'advisory' "
                "AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
            assert cur.fetchall() == [(True,)], "one lock backend, gone before the standby's attempt"
        admin.close()
        assert a.ensure(now) is False
        assert b.ensure(now) is True
    finally:
        a.release()
        b.release()


class _Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_stale_heartbeat_is_not_leadership(pg_templates: Templates) -> None:
    """A holder whose last successful heartbeat was sent more than a lease ago does not act (no two
    leaders); the lease runs on the monotonic clock from the heartbeat's send, not its answer."""
    clock = _Clock()
    a = AdvisoryLock(make_engine(parse_url(pg_templates.clone("3.1.2")), pool_size=1), 4242, lease=LEASE, clock=clock)
    try:
        assert a.ensure(datetime.now(UTC))
        clock.now += 2.0
        sent = clock.now
        assert a.ensure(datetime.now(UTC))  # heartbeat sent at `sent`
        clock.now = sent + LEASE.total_seconds() - 0.001
        assert a.is_leader() and a.fence() is not None
        clock.now = sent + LEASE.total_seconds()
        assert not a.is_leader() and a.fence() is None
    finally:
        a.release()


def test_a_heartbeat_overdue_past_the_lease_is_a_lock_problem(pg_templates: Templates) -> None:
    """The held lock's lease ended with no answer to a heartbeat (a stalled server, before the call's
    deadline): the replica neither leads nor stands by behind a live leader, so it reports
    lock_unavailable (with no problem /readyz said "standby: another replica holds the leader lock" on a
    single replica). A heartbeat answered again clears it."""
    clock = _Clock()
    a = AdvisoryLock(make_engine(parse_url(pg_templates.clone("3.1.2")), pool_size=1), 4242, lease=LEASE, clock=clock)
    try:
        assert a.ensure(datetime.now(UTC)) and a.problem is None
        clock.now += LEASE.total_seconds()  # no heartbeat answered within the lease
        problem = a.problem
        assert not a.is_leader() and problem is not None, problem
        assert problem.code == "lock_unavailable" and "no answer within its 3s lease" in problem.reason, problem
        assert a.ensure(datetime.now(UTC)) and a.problem is None
    finally:
        a.release()


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_new_leader_waits_before_its_first_write(mode: str, pg_templates: Templates) -> None:
    """Just after taking the lock a replica leads (it detects and alerts) but holds no fence until its
    takeover wait is over; the fence then names the lock backend that holds the lock (checked in
    pg_locks), ends with the lease, and a terminated lock backend no longer holds it there."""
    from detector.metadb import leader_lock

    url = pg_templates.clone("3.1.2")
    clock = _Clock()
    wait = timedelta(seconds=5)
    engine = make_engine(parse_url(url), pool_size=1)
    a = AdvisoryLock(engine, 4242, mode=mode, lease=LEASE, takeover_wait=wait, clock=clock)
    checker = make_engine(parse_url(url))
    try:
        assert a.ensure(datetime.now(UTC))
        assert a.is_leader() and a.fence() is None
        assert a.waiting() == pytest.approx(wait.total_seconds())
        clock.now += wait.total_seconds() - 0.1
        assert a.ensure(datetime.now(UTC)) and a.fence() is None, "still waiting"
        clock.now += 0.1
        fence = a.fence()
        assert fence is not None and fence.valid() and a.waiting() is None
        assert fence.ends == pytest.approx(clock.now - 0.1 + LEASE.total_seconds())
        assert fence.key == 4242 and fence.backend_pid is not None
        with checker.connect() as conn:
            assert leader_lock.advisory_lock_granted_to(conn, 4242, fence.backend_pid)
            assert not leader_lock.advisory_lock_granted_to(conn, 4242, fence.backend_pid + 1)
            gone = conn.execute(
                text("SELECT pg_terminate_backend(:p, :ms)"), {"p": fence.backend_pid, "ms": EXIT_WAIT_MS}
            )
            assert gone.scalar() is True
            assert not leader_lock.advisory_lock_granted_to(conn, 4242, fence.backend_pid)
        assert a.ensure(datetime.now(UTC)) is False and a.fence() is None
    finally:
        a.release()
        checker.dispose()


def test_a_stopped_daemon_never_takes_the_lock_again(pg_templates: Templates) -> None:
    """After ``shutdown`` a leader check (APScheduler's thread may still fire one) leaves the lock free
    for the standby: a stopping leader that retook it would hold up the takeover until its process
    exits (seen as a flaky restart test under load)."""
    from tests.daemon_harness import start_daemon, wait_for

    url = pg_templates.clone("3.1.2")
    running = start_daemon(url, durable=False)
    standby = _lock(url, "session")
    try:
        wait_for(running.is_leader, what="leadership")
        running.stop()
        running.daemon.check_leader()  # a late scheduled check, after the release
        key = running.daemon.config.lock_key
        standby = AdvisoryLock(make_engine(parse_url(url), pool_size=1), key, mode="session", lease=LEASE)
        assert standby.ensure(datetime.now(UTC)), "the lock is free for the next replica"
    finally:
        standby.release()


@pytest.mark.parametrize("mode", ["session", "transaction"])
def test_a_standby_keeps_one_connection_for_its_attempts(mode: str, pg_templates: Templates) -> None:
    """A standby tries the lock every check interval on one kept connection (a new one each time cost
    the database a backend start a second), holds nothing while it waits, and takes over on
    that connection once the holder lets go. The session lock's pinning proof opens a second client once."""
    from sqlalchemy import event

    url = pg_templates.clone("3.1.2")
    now = datetime.now(UTC)
    a, b = _lock(url, mode), _lock(url, mode)
    connects: list[object] = []
    event.listen(b.engine, "connect", lambda *args: connects.append(args))
    try:
        assert a.ensure(now)
        for _ in range(10):
            assert b.ensure(now) is False
            assert a.ensure(now) is True, "the standby's attempts never take or hold the lock"
        # session: one more, once, for the second client of the pinning proof (engine.is_pinned)
        kept = 1 if mode == "transaction" else 2
        assert len(connects) == kept, f"{len(connects)} connections for 10 attempts"
        a.release()
        assert b.ensure(now) is True
        assert len(connects) == kept, "the standby leads on the connection it kept"
        assert a.ensure(now) is False
    finally:
        a.release()
        b.release()

"""Leader election with a PostgreSQL advisory lock: exactly one replica acts, and never two.

``session`` lock: ``pg_try_advisory_lock(key)`` on a dedicated autocommit connection; PostgreSQL drops
it the moment that backend's connection ends (SIGKILLed leader, terminated backend), so a standby
trying every ``leader_check_interval`` takes over within about a second. ``transaction`` lock:
``pg_try_advisory_xact_lock`` inside a transaction kept open, which PgBouncer's transaction pooling
pins to one server connection. A session lock through transaction pooling is taken on whichever
server connection the statement landed on and is then shared with other clients: two replicas both
"hold" it (docs/explanation/airflow-internals.md, "Next to the official Helm chart"; the chart's ``pgbouncer.enabled``).

Pooler detection, at every (re)connect of the lock connection: the session is *pinned* when it is
proven to stay on one server session across transactions while another client of the same URL runs
its own (``detector.metadb.engine.is_pinned``: a backend pid and a session variable read back). Direct
connections, a plain TCP proxy and PgBouncer's session pooling are pinned; transaction and statement
pooling never are, whatever the addresses say (comparing the server's view of the
client's address and port with the local socket was fooled when a pooler on the same host used the
same ephemeral port). ``auto`` (the default) takes the session lock only on a pinned session and the
transaction lock otherwise; ``session`` refuses to lead on a session not pinned, with a one-line
reason naming the setting.

The proof is strong, not absolute: behind transaction pooling a busy neighbour can fool it (seen once
in CI). A fooled proof must still never give two leaders, so the session lock does not trust it alone:

- Acquisition is one statement that takes the lock only if this server session does not already hold
  the key (``leader_lock.try_advisory_lock_unshared``): advisory locks are re-entrant per server session,
  so a standby landing on the leader's pooled session was granted the lock too. "Already held here"
  means a pooler shares server sessions: not taken, ``LOCK_POOLED`` (reason naming
  DUPGUARD_LOCK_MODE=transaction and DUPGUARD_LOCK_DATABASE_URL), and this replica takes no session
  lock again (``auto``: the transaction lock; ``session``: refused, ``LOCK_REFUSED``). The transaction lock's attempt is
  guarded the same way (re-entrancy holds across levels: a fooled replica's session lock on the
  session a transaction lands on). The backend pid comes from the same statement.
- The heartbeat stays one statement (``leader_lock.session_lock_status``): not in recovery, the lock still
  granted to the backend read at acquisition, and whether the statement ran there. Not granted any
  more (the pooler closed that server session, ``pg_terminate_backend``): leadership lost as with a
  lost connection, where before a heartbeat landing elsewhere succeeded and the replica led on beside
  the next holder. Granted but run elsewhere (the proof was fooled): the replica leads on, with
  ``LOCK_POOLED`` (state ``lock_pooled``, one warning), and every heartbeat checks the lock again. It
  does not step down: the lock stays granted to that server session whatever it does (only a
  statement landing there can unlock it), so it still excludes every other replica, and stepping down
  would leave no leader at all until the pooler closes the session.
- Release unlocks only on that backend (``CASE WHEN pg_backend_pid() = pid``, ``RELEASE_ATTEMPTS``
  tries; on a direct connection the first one): an unlock elsewhere releases nothing of ours. When
  none lands there it warns (``leader_lock_left_on_server_session``) that the lock stays on that
  server session, with no leader, until the pooler closes it: prefer none to two.

Standbys: advisory locks work on a hot standby, where they exclude only the replicas on
that standby. At every (re)connect, and at every heartbeat (a primary behind a stable URL can be
replaced by a standby), the lock connection asks ``pg_is_in_recovery()``; on a standby no lock is
taken or kept (``LOCK_ON_STANDBY``, with a reason naming DUPGUARD_LOCK_DATABASE_URL).

Prefer no leader over two: the leader acts only while its last successful heartbeat is younger than
``lease``; each heartbeat has a client-side deadline (``detector.metadb.engine``), so a stalled lock backend
(``kill -STOP``) ends leadership within the lease instead of hanging the heartbeat. The transaction
lock also sets ``idle_in_transaction_session_timeout`` (twice the lease, for its transaction only) so
the server frees the lock of a leader that went silent — after that leader has stopped acting.

Fencing (docs/explanation/remediation.md, "Leadership and fencing"): the lease runs on the monotonic
clock from the moment the last successful heartbeat was *sent* (its answer proves the lock was still
held at some point after that), and ``fence()`` hands the remediation a ``Fence`` valid only until
then: every write is made only while it is valid, with its whole timeout clipped to what is left.
A replica that has just taken the lock waits ``takeover_wait`` (lease + the longest write timeout)
before its first write, so a write the previous holder sent just before its lease ended has landed
(or never will) before this one judges the group again; it leads meanwhile (detection and alerting
go on) but ``fence()`` is None. The ``Fence`` also carries the lock backend's pid
(``pg_backend_pid()`` on the lock connection, read at acquisition): the ``db`` backend checks in
its own write transaction that the lock is still granted to that backend.

A standby that finds the lock taken checks that its holder is alive: a holder's backend that did
nothing for three leases (a healthy leader heartbeats every check interval) means no replica can act,
which ``problem`` reports. SQLite (single ``airflow standalone``) always leads.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from detector import logs
from detector.core.fence import UNFENCED, Fence
from detector.metadb import leader_lock
from detector.metadb.engine import describe_error, is_pinned

log = logs.get("dupguard.leader")

# Problem codes (``LockProblem.code``); ``detector.app.status`` maps them to states.
LOCK_UNAVAILABLE = "lock_unavailable"
LOCK_REFUSED = "lock_refused"
LEADER_UNRESPONSIVE = "leader_unresponsive"
LOCK_ON_STANDBY = "lock_on_standby"
LOCK_POOLED = "lock_pooled"
RELEASE_ATTEMPTS = 3  # guarded unlocks before a fooled leader gives up reaching its lock's server session


@dataclass(frozen=True)
class LockProblem:
    """Why this replica can neither lead nor trust that another one does."""

    code: str
    reason: str


STANDBY_PROBLEM = LockProblem(
    LOCK_ON_STANDBY,
    "the leader-lock connection reached a hot standby (pg_is_in_recovery() is true), where an advisory lock "
    "excludes only the replicas on that standby: no lock is taken there. Point DUPGUARD_LOCK_DATABASE_URL "
    "(or DUPGUARD_DATABASE_URL, its default) at the primary: a writer endpoint, not a reader endpoint; a "
    "multi-host URL needs target_session_attrs=read-write",
)


POOLED_ADVICE = (
    "a pooler in transaction or statement pooling (e.g. PgBouncer) shares server sessions between clients, "
    "and the pinning proof was fooled. Set DUPGUARD_LOCK_MODE=transaction, or DUPGUARD_LOCK_DATABASE_URL "
    "to a direct URL"
)
POOLED_ATTEMPT = LockProblem(
    LOCK_POOLED,
    "a lock attempt ran on a server session that already holds the leader lock for another client, where "
    "PostgreSQL would grant it again (advisory locks are re-entrant per server session): not taken, so no "
    f"second leader; {POOLED_ADVICE}. This replica takes no session lock from now on",
)


def _pooled_leader(pid: int) -> LockProblem:
    return LockProblem(
        LOCK_POOLED,
        f"the leader lock's heartbeat ran on another server session than the one holding its session lock "
        f"(backend pid {pid}): {POOLED_ADVICE}. The lock is still granted to that session, so no other replica "
        "can take it: this replica leads on while every heartbeat checks that, but it may not reach that session "
        "to release the lock, which then stays there until the pooler closes the server connection",
    )


class InRecovery(SQLAlchemyError):
    """The lock's server is (now) a standby: the heartbeat fails like a lost connection."""


class LockLost(SQLAlchemyError):
    """The session lock is no longer granted to its server session: the heartbeat fails like a lost
    connection (behind a pooler it may have run, and succeeded, on another server session)."""


class AlwaysLeader:
    problem: LockProblem | None = None

    def fence(self) -> Fence | None:
        return UNFENCED

    def waiting(self) -> float | None:
        return None

    def ensure(self, now: datetime) -> bool:
        return True

    def is_leader(self, now: datetime) -> bool:
        return True

    def release(self) -> None:
        return None


_terms = itertools.count(1)  # process-wide, so a new lock object never reuses a term number


class AdvisoryLock:
    def __init__(
        self,
        engine: Engine,
        key: int,
        *,
        mode: str = "auto",
        lease: timedelta,
        takeover_wait: timedelta = timedelta(0),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.key = key
        self.mode = mode
        self.lease = lease
        self.takeover_wait = takeover_wait  # before the first write of a term (module docstring)
        self.clock = clock
        self._problem: LockProblem | None = None  # the last check's finding (``problem`` adds an overdue one)
        self.lock_kind: str | None = None  # session | transaction, chosen at the last connect
        self.term = 0  # the current (or last) term's number; 0 before the first
        self._conn: Connection | None = None
        self._lease_end: float | None = None  # monotonic: last successful heartbeat's send + lease
        self._acts_from = 0.0  # monotonic: the end of this term's takeover wait
        self._backend_pid: int | None = None  # the lock backend's pg_backend_pid(), read at acquisition
        self._attempt: tuple[Connection, str | None] | None = None  # a standby's connection and its lock kind
        self._pooled = False  # a pooler was seen sharing server sessions: the pinning proof is not trusted

    def is_leader(self, now: datetime | None = None) -> bool:
        """Holds the lock within its lease (``now`` is unused: the lease runs on the monotonic clock)."""
        return self._conn is not None and self._lease_end is not None and self.clock() < self._lease_end

    def fence(self) -> Fence | None:
        """Permission to write now, until the lease ends; None while standing by or waiting to act."""
        ends, now = self._lease_end, self.clock()
        if self._conn is None or ends is None or now >= ends or now < self._acts_from:
            return None
        return Fence(self.term, ends, self.clock, self.key, self._backend_pid)

    def waiting(self) -> float | None:
        """Seconds left of this term's takeover wait; None when not leading or not waiting."""
        left = self._acts_from - self.clock()
        return left if self.is_leader() and left > 0 else None

    def ensure(self, now: datetime) -> bool:
        """Heartbeat the held lock, or try to take it. Returns leadership after the attempt."""
        if self._conn is not None:
            sent = self.clock()
            try:
                self._heartbeat(self._conn)
                self._lease_end = sent + self.lease.total_seconds()
            except SQLAlchemyError as exc:
                reason = describe_error(exc, self.engine.url)
                log.warning("leader_lost", reason=reason)
                lost = LockProblem(LOCK_UNAVAILABLE, f"the lock check failed: {reason}")
                self._report(STANDBY_PROBLEM if isinstance(exc, InRecovery) else lost)
                self._drop()
            return self.is_leader(now)
        return self._try_acquire(now)

    def _try_acquire(self, now: datetime) -> bool:
        """One attempt at the lock. A standby keeps its connection between attempts (it holds no lock
        while it has not got one): a new connection every check interval cost the database a backend
        start each second, more than the leader's whole idle cost."""
        sent = self.clock()
        try:
            conn, kind = self._attempt_connection()
            if kind is None:
                self._drop_attempt()
                return False
            xact = kind == "transaction"
            if xact:
                conn.begin()
                leader_lock.set_local_idle_in_transaction_timeout(conn, 2 * self.lease)
            # The pid in the same statement: behind a pooler a second one may run on another backend.
            pid, got = leader_lock.try_advisory_lock_unshared(conn, self.key, xact=xact)
            idle = None if got is not False else leader_lock.advisory_lock_holder_idle(conn, self.key)
            if xact and not got:
                conn.rollback()  # end the attempt's transaction: nothing held, connection kept
        except SQLAlchemyError as exc:
            self._report(LockProblem(LOCK_UNAVAILABLE, describe_error(exc, self.engine.url)))
            self._drop_attempt()
            return False
        if got is None:  # another client's lock on this very server session: a pooler shares it
            self._pooled = True
            self._drop_attempt()  # the next attempt classifies a new connection, without the proof
            self._report(POOLED_ATTEMPT)
            return False
        if not got:
            stale = idle is not None and idle > 3 * self.lease.total_seconds()
            self._report(
                LockProblem(
                    LEADER_UNRESPONSIVE,
                    f"the lock holder's backend has been silent for {idle:.0f}s (stalled or cut off)",
                )
                if stale and idle is not None
                else None
            )
            return False
        self._attempt = None  # now the lock's own connection
        self._conn, self.lock_kind, self._backend_pid = conn, kind, pid
        self._lease_end = sent + self.lease.total_seconds()
        # From after the lock was granted: the previous holder lost it before then, so every write it
        # could still send ends (client side) within one lease of now, and lands within its timeout.
        wait = self.takeover_wait.total_seconds()
        self._acts_from = self.clock() + wait
        self.term = next(_terms)
        self._report(None)
        log.info("leader_acquired", lock_key=self.key, lock=kind, mode=self.mode, term=self.term)
        if wait > 0:
            log.info(
                "leader_waiting_to_act", seconds=round(wait, 2), reason="the previous leader's writes may still land"
            )
        return True

    def _attempt_connection(self) -> tuple[Connection, str | None]:
        """The standby's connection for lock attempts, opened and classified (``_lock_kind``) once."""
        if self._attempt is None:
            conn = self.engine.connect()
            try:
                kind = self._lock_kind(conn)
                conn.rollback()  # end the check's implicit transaction before choosing the lock's
                if kind == "session":
                    conn.execution_options(isolation_level="AUTOCOMMIT")
            except BaseException:
                _close_quietly(conn)
                raise
            self._attempt = (conn, kind)
        return self._attempt

    def _drop_attempt(self) -> None:
        if self._attempt is not None:
            _close_quietly(self._attempt[0])
            self._attempt = None

    def _lock_kind(self, conn: Connection) -> str | None:
        """The lock to take on this connection, or None (and a problem) on a standby or when ``session``
        must refuse."""
        if leader_lock.in_recovery(conn):
            self._report(STANDBY_PROBLEM)
            return None
        if self.mode == "transaction":
            return "transaction"
        pinned = not self._pooled and is_pinned(conn)  # a pooler seen sharing sessions: no proof trusted
        if self.mode == "auto":
            return "session" if pinned else "transaction"
        if not pinned:
            self._report(
                LockProblem(
                    LOCK_REFUSED,
                    "the leader-lock connection is not pinned to one server session (a pooler in transaction "
                    "or statement pooling, e.g. PgBouncer), where a session lock can be shared by two replicas: "
                    "set DUPGUARD_LOCK_MODE=auto (or transaction), or DUPGUARD_LOCK_DATABASE_URL to a direct URL",
                )
            )
            return None
        return "session"

    def _heartbeat(self, conn: Connection) -> None:
        """The leader's round trip, which also asks whether the server is in recovery now. The session
        lock's also checks, in the same statement, that the lock is still granted to its backend and
        whether the statement ran there: behind a pooler a fooled proof let it run (and succeed) on
        another server session while the lock's own had ended (module docstring)."""
        pid = self._backend_pid
        if self.lock_kind == "transaction" or pid is None:  # the open transaction pins the connection
            if leader_lock.in_recovery(conn):
                raise InRecovery(STANDBY_PROBLEM.reason)  # ``ensure`` reports it as lock_on_standby
            return
        recovery, held, here = leader_lock.session_lock_status(conn, self.key, pid)
        if recovery:
            raise InRecovery(STANDBY_PROBLEM.reason)
        if not here:
            self._pooled = True  # after this term: the transaction lock (auto), or none (session)
        if not held:
            raise LockLost(
                f"the session lock is no longer granted to its server session (backend pid {pid}): that "
                "session ended (terminated, or closed by a pooler) or the lock was released there"
            )
        if not here:
            self._report(_pooled_leader(pid))

    def _report(self, problem: LockProblem | None) -> None:
        if problem is not None and (self._problem is None or self._problem.code != problem.code):
            if problem.code == LOCK_POOLED:  # what the lock does about it, beside the state's warning
                log.warning("leader_lock_pooled", leading=self._conn is not None, reason=problem.reason)
            else:  # debug: detector.app.status logs the resulting state change once, as a warning
                log.debug("leader_lock_problem", problem=problem.code, reason=problem.reason)
        self._problem = problem

    @property
    def problem(self) -> LockProblem | None:
        """Why this replica neither leads nor can trust that another one does, or (``lock_pooled``) why
        its leadership rests on a server session it may not reach. Also while the held
        lock's check is overdue (the lease ended with no answer: a stalled server, before the call's
        deadline), which is no standby behind a live leader: nobody may be acting."""
        ends = self._lease_end
        if self._conn is not None and ends is not None and self.clock() >= ends:
            return LockProblem(
                LOCK_UNAVAILABLE,
                f"the lock check failed: the leader lock's heartbeat had no answer within its "
                f"{self.lease.total_seconds():g}s lease (the database is stalled or cut off)",
            )
        return self._problem

    def release(self) -> None:
        # Closing the connection releases a session or transaction lock alike, but only once the server
        # has noticed; unlocking first (bounded by the call deadline) frees it for the standby's very
        # next attempt, which may come on a connection it kept open.
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                if self.lock_kind == "transaction":
                    self._conn.rollback()
                else:
                    self._unlock_session(self._conn)
            log.info("leader_released", lock_key=self.key)
        self._drop()

    def _unlock_session(self, conn: Connection) -> None:
        """Unlock on the lock's own backend only (an unlock elsewhere releases nothing of ours), a few
        times behind a pooler; then say where the lock stays. Once on a direct connection."""
        pid = self._backend_pid
        if pid is None:
            return
        for _ in range(RELEASE_ATTEMPTS):
            if leader_lock.advisory_unlock_on(conn, self.key, pid) is not None:
                return
        log.warning(
            "leader_lock_left_on_server_session",
            backend_pid=pid,
            reason=f"the release's unlocks ran on other server sessions: the leader lock stays on backend pid {pid} "
            "until the pooler closes that server connection (PgBouncer: server_lifetime, RECONNECT, a restart); no "
            f"replica leads meanwhile. {POOLED_ADVICE}",
        )

    def _drop(self) -> None:
        _close_quietly(self._conn)
        self._conn, self._lease_end, self._backend_pid = None, None, None
        self._drop_attempt()


def _close_quietly(conn: Any) -> None:
    if conn is None:
        return
    with contextlib.suppress(SQLAlchemyError):
        conn.invalidate()  # never return a lock-holding connection to the pool
        conn.close()

"""The leader lock's statements (detector/app/leader.py) and the standby probes beside them: PostgreSQL
advisory locks, pg_locks and pg_stat_activity, the server's recovery state."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Integer,
    Select,
    bindparam,
    case,
    column,
    func,
    literal,
    null,
    select,
    table,
)
from sqlalchemy.dialects.postgresql import OID

# --- leader lock (detector/app/leader.py) ----------------------------------------------------------

_pg_locks = table(
    "pg_locks", column("locktype"), column("database"), column("classid"), column("objid"), column("objsubid"),
    column("pid"), column("granted"),
)  # fmt: skip
_pg_stat_activity = table("pg_stat_activity", column("pid"), column("state_change"))
_pg_database = table("pg_database", column("oid"), column("datname"))


PIN_SETTING = "dupguard.pin_check"  # a custom (placeholder) variable: nothing in the server reads it


def mark_session(conn: Connection, nonce: str) -> int:
    """Set ``PIN_SETTING`` to ``nonce`` for the rest of the server session (``set_config(..., false)``);
    the backend's pid (``detector.metadb.engine.is_pinned``)."""
    row = conn.execute(select(func.pg_backend_pid(), func.set_config(PIN_SETTING, nonce, False))).one()
    return int(row[0])


def session_mark(conn: Connection) -> tuple[int, str | None]:
    """The backend's pid and this server session's ``PIN_SETTING`` (None or '' when it never set one)."""
    row = conn.execute(select(func.pg_backend_pid(), func.current_setting(PIN_SETTING, True))).one()
    return int(row[0]), row[1]


def in_recovery(conn: Connection) -> bool:
    """Whether the server is a standby replaying WAL (hot standby, reader endpoint): ``pg_is_in_recovery()``."""
    return bool(conn.execute(select(func.pg_is_in_recovery())).scalar())


def recovery_status(conn: Connection) -> tuple[bool, float | None]:
    """``(in recovery, replay lag in seconds)``. The lag is 0 when the standby has replayed all the WAL
    it received, else the age of the last transaction it replayed (``pg_last_xact_replay_timestamp``);
    None on a primary, or before a standby replayed anything."""
    caught_up = func.pg_last_wal_receive_lsn() == func.pg_last_wal_replay_lsn()
    age = func.extract("epoch", func.now() - func.pg_last_xact_replay_timestamp())
    row = conn.execute(select(func.pg_is_in_recovery(), case((caught_up, literal(0)), else_=age))).one()
    return bool(row[0]), None if row[1] is None or not row[0] else float(row[1])


def try_advisory_lock_unshared(conn: Connection, key: int, *, xact: bool) -> tuple[int, bool | None]:
    """``(this backend's pid, granted)``: ``pg_try_advisory_lock`` (``xact``: ``pg_try_advisory_xact_lock``),
    unless this server session already holds ``key``; then granted is None and nothing is taken.

    An advisory lock is re-entrant per backend, at either level: behind a pooler that shares server
    sessions (transaction pooling) another client's session lock on the session this statement lands on
    would be granted to us too, and two replicas would lead. One statement, so the check, the attempt
    and the pid are of one backend with no other client in between. Our own attempt never holds the key
    before it (a standby holds nothing; a leader does not try again)."""
    row = conn.execute(_unshared_lock_query(key, xact)).one()
    return int(row[0]), None if row[1] is None else bool(row[1])


# Built once per key: constructing these selects on every call cost several times the rest of the call's
# client CPU, once per check interval on the leader and on every standby.
@functools.lru_cache(maxsize=8)
def _unshared_lock_query(key: int, xact: bool) -> Select[Any]:
    held = select(literal(1)).select_from(_pg_locks).where(*_granted_to(key, func.pg_backend_pid())).exists()
    attempt = func.pg_try_advisory_xact_lock(key) if xact else func.pg_try_advisory_lock(key)
    return select(func.pg_backend_pid(), case((held, null()), else_=attempt))


@functools.lru_cache(maxsize=8)
def _session_lock_status_query(key: int) -> Select[Any]:
    pid = bindparam("lock_pid", type_=Integer)
    held = select(literal(1)).select_from(_pg_locks).where(*_granted_to(key, pid)).exists()
    return select(func.pg_is_in_recovery(), held, func.pg_backend_pid() == pid)


def session_lock_status(conn: Connection, key: int, pid: int) -> tuple[bool, bool, bool]:
    """The session lock's heartbeat, one statement: ``(in recovery, key still granted to backend pid,
    this statement ran on backend pid)``. Behind a pooler the statement may run on another server
    session than the lock's, where ``pg_is_in_recovery()`` alone proved nothing about the lock."""
    row = conn.execute(_session_lock_status_query(key), {"lock_pid": pid}).one()
    return bool(row[0]), bool(row[1]), bool(row[2])


def advisory_unlock_on(conn: Connection, key: int, pid: int) -> bool | None:
    """Release session lock ``key`` now if this statement runs on backend ``pid`` (closing the connection
    releases it too, but only once the server has noticed the socket close): True released, False not
    held there, None ran on another backend (a pooler), where an unlock would release nothing of ours."""
    unlock = case((func.pg_backend_pid() == pid, func.pg_advisory_unlock(key)), else_=null())
    value = conn.execute(select(unlock)).scalar()
    return None if value is None else bool(value)


def set_local_idle_in_transaction_timeout(conn: Connection, timeout: timedelta) -> None:
    """For the current transaction only (``set_config(..., true)`` is ``SET LOCAL``): nothing leaks into
    the session, which behind PgBouncer may later serve other clients."""
    ms = str(max(1, int(timeout.total_seconds() * 1000)))
    conn.execute(select(func.set_config("idle_in_transaction_session_timeout", ms, True)))


def _advisory_key(key: int) -> list[Any]:
    """A bigint advisory key as pg_locks stores it: classid (high 32 bits), objid (low 32 bits),
    objsubid 1, in the current database."""
    lk, db = _pg_locks, _pg_database
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return [
        lk.c.locktype == "advisory",
        lk.c.granted.is_(True),
        lk.c.classid == literal(unsigned >> 32).cast(OID),
        lk.c.objid == literal(unsigned & 0xFFFFFFFF).cast(OID),
        lk.c.objsubid == 1,
        lk.c.database == select(db.c.oid).where(db.c.datname == func.current_database()).scalar_subquery(),
    ]


def _granted_to(key: int, pid: Any) -> list[Any]:
    return [*_advisory_key(key), _pg_locks.c.pid == pid]


def advisory_lock_granted_to(conn: Connection, key: int, pid: int) -> bool:
    """Whether advisory lock ``key`` (session or transaction lock alike) is granted to backend ``pid``
    right now: the fence check inside a remediation's write transaction (pg_locks is server-wide)."""
    query = select(func.count()).select_from(_pg_locks).where(*_granted_to(key, pid))
    return bool(conn.execute(query).scalar())


def advisory_lock_holder_idle(conn: Connection, key: int) -> float | None:
    """Seconds since the backend holding advisory lock ``key`` in this database last changed state;
    None if nobody holds it or its activity is hidden from this role. A bigint key is stored as
    classid (high 32 bits), objid (low 32 bits), objsubid 1."""
    lk, act = _pg_locks, _pg_stat_activity
    idle = func.extract("epoch", func.clock_timestamp() - act.c.state_change)
    query = select(func.max(idle)).select_from(lk.join(act, act.c.pid == lk.c.pid)).where(*_advisory_key(key))
    value = conn.execute(query).scalar()
    return None if value is None else float(value)

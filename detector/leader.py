"""Leader election with a PostgreSQL advisory lock: exactly one replica acts, and never two.

``session`` mode holds ``pg_try_advisory_lock(key)`` on a dedicated connection; PostgreSQL drops it the
moment that backend's connection ends (SIGKILLed leader, terminated backend), so a standby trying every
``leader_check_interval`` takes over within about a second. ``transaction`` mode holds
``pg_try_advisory_xact_lock`` inside an open transaction, which PgBouncer's transaction pooling pins to
one server connection (a session lock through PgBouncer would be lost or leaked; facts §6).

Prefer no leader over two: the leader acts only while its last successful heartbeat is younger than
``lease``, which is shorter than the ~9 s the server needs to notice a silently dead client
(keepalives + tcp_user_timeout in ``detector.db``). A partitioned old leader therefore stops acting
before the server can hand the lock to anyone else. SQLite (single ``airflow standalone``) always leads.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import SQLAlchemyError

from detector import logs

log = logs.get("dupguard.leader")


class AlwaysLeader:
    def ensure(self, now: datetime) -> bool:
        return True

    def is_leader(self, now: datetime) -> bool:
        return True

    def release(self) -> None:
        return None


class AdvisoryLock:
    def __init__(self, engine: Engine, key: int, *, mode: str = "session", lease: timedelta) -> None:
        self.engine = engine
        self.key = key
        self.mode = mode
        self.lease = lease
        self._conn: Connection | None = None
        self._last_ok: datetime | None = None

    def is_leader(self, now: datetime) -> bool:
        return self._conn is not None and self._last_ok is not None and now - self._last_ok <= self.lease

    def ensure(self, now: datetime) -> bool:
        """Heartbeat the held lock, or try to take it. Returns leadership after the attempt."""
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                self._last_ok = now
            except SQLAlchemyError as exc:
                log.warning("leader_lost", reason=type(exc).__name__)
                self._drop()
            return self.is_leader(now)
        return self._try_acquire(now)

    def _try_acquire(self, now: datetime) -> bool:
        conn: Connection | None = None
        try:
            conn = self.engine.connect()
            if self.mode == "transaction":
                conn.begin()
                got = conn.execute(text("SELECT pg_try_advisory_xact_lock(:k)"), {"k": self.key}).scalar()
            else:
                conn.execution_options(isolation_level="AUTOCOMMIT")
                got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar()
        except SQLAlchemyError as exc:
            log.debug("leader_lock_unavailable", reason=type(exc).__name__)
            _close_quietly(conn)
            return False
        if not got:
            _close_quietly(conn)
            return False
        self._conn, self._last_ok = conn, now
        log.info("leader_acquired", lock_key=self.key, mode=self.mode)
        return True

    def release(self) -> None:
        # Closing the backend connection releases a session or transaction lock alike.
        if self._conn is not None:
            log.info("leader_released", lock_key=self.key)
        self._drop()

    def _drop(self) -> None:
        _close_quietly(self._conn)
        self._conn, self._last_ok = None, None


def _close_quietly(conn: Any) -> None:
    if conn is None:
        return
    try:
        conn.invalidate()  # never return a lock-holding connection to the pool
        conn.close()
    except SQLAlchemyError:
        pass

"""Engines for Airflow's metadata database: URL normalisation, redaction, timeouts, error wrapping."""

from __future__ import annotations

import contextlib
import secrets
import select
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import psycopg2
import psycopg2.extensions
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from detector import redact as _redact
from detector.errors import ConfigError, DatabaseError
from detector.metadb import catalog, leader_lock
from detector.metadb.schema import AirflowTables, airflow_tables
from detector.metadb.versions import SchemaInfo, identify

_POSTGRES_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg2"}
_FAMILY_TABLES = ("dag_run", "asset_partition_dag_run")


def parse_url(raw: str) -> URL:
    """A SQLAlchemy URL for Airflow's metadata DB; ``postgres://`` and driverless URLs use psycopg2.

    PostgreSQL URLs are split the way libpq splits them (``_split_postgres``), not by SQLAlchemy's
    ``make_url``, whose pattern looks for the userinfo's ``@`` past the host: in
    ``postgresql://u@db:5432/a?password=x@y`` it took ``y`` for the host and ``5432/a?password=x`` for
    the password, which then showed in every redacted message.
    """
    text = raw.strip()
    scheme, sep, rest = text.partition("://")
    try:
        url = _split_postgres(scheme, rest) if sep and scheme in _POSTGRES_SCHEMES else make_url(text)
        _ = url.port  # a non-numeric port raises here or in make_url
    except (ArgumentError, ValueError):
        raise ConfigError([_why_not_a_url(text)]) from None
    if url.drivername in _POSTGRES_SCHEMES:
        return url.set(drivername="postgresql+psycopg2")
    if url.drivername in {"sqlite", "sqlite+pysqlite"}:
        return url
    raise ConfigError([f"database URL scheme {url.drivername!r} is not supported (postgresql:// or sqlite:///)"])


def _split_postgres(scheme: str, rest: str) -> URL:
    """libpq's reading of ``user:password@host:port/dbname?key=value`` (``conninfo_uri_parse_options``).

    The authority ends at the first ``/`` (so ``:``, ``?`` and ``#`` may stay raw in the userinfo's
    password, and anything in the query is the query's), or at the first ``?`` when there is no path.
    In the authority the userinfo ends at the last ``@`` (libpq takes the first and then fails to
    resolve a host holding the password's tail); the password starts after the first ``:``. Every
    part is percent-decoded and ``+`` stays ``+``, as in libpq (``parse_qsl`` would make it a space).
    """
    slash = rest.find("/")
    end = slash if slash >= 0 else (rest.find("?") if "?" in rest else len(rest))
    authority, tail = rest[:end], rest[end:]
    userinfo, at, hostport = authority.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if hostport.startswith("["):  # [IPv6]:port
        host, bracket, port = hostport[1:].partition("]")
        if not bracket or (port and not port.startswith(":")):
            raise ValueError("bad IPv6 host")
        port = port[1:]
    else:
        host, _, port = hostport.partition(":")
    path, _, query = tail.partition("?")
    params: dict[str, list[str]] = {}
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        params.setdefault(unquote(key), []).append(unquote(value))
    return URL.create(
        scheme,
        username=unquote(user) if at else None,
        password=unquote(password) if colon else None,
        host=unquote(host) or None,
        port=int(port) if port else None,
        database=unquote(path[1:]) or None,
        query={k: v[0] if len(v) == 1 else tuple(v) for k, v in params.items()},
    )


def _why_not_a_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError:
        return "database URL has an invalid host or port (the port must be a number 1-65535)"
    return "database URL is not a URL (expected postgresql://user:pass@host:5432/db or sqlite:////path/airflow.db)"


def redact(url: URL) -> str:
    """The URL as text with its password and secret query values masked: safe for logs and errors."""
    return _redact.db_url(url)


def sqlite_path(url: URL) -> Path | None:
    """The file behind a ``sqlite:///`` URL (None for in-memory databases)."""
    database = url.database or ""
    return None if database in ("", ":memory:") or database.startswith("file:") else Path(database)


DEFAULT_CALL_TIMEOUT = 60.0  # one-shot commands (scan, init-db); the daemon passes --db-timeout


class CallTimeout(psycopg2.OperationalError):  # type: ignore[misc]
    """A database call outlived its deadline. The message contains "closed the connection" so
    SQLAlchemy classifies it as a disconnect and discards the connection instead of reusing it."""


def _wait_with_deadline(conn: Any) -> None:
    """psycopg2 wait callback: libpq in non-blocking mode, each round trip bounded by the connection's
    ``call_timeout`` (``connect``, ``execute``, ``commit`` alike).

    A client-side deadline is the one timeout that works everywhere: a server-side
    ``statement_timeout`` does not stick behind PgBouncer's transaction pooling (a session SET lands on
    whichever server connection ran it), cannot be a startup parameter there, and is never enforced by
    a stalled backend (``kill -STOP``) or across a network black hole. On expiry the socket is shut
    down so the server (or PgBouncer) sees the client leave; the connection is then discarded.
    (The connection cannot be closed here: psycopg2 holds its lock during the call.)
    """
    timeout: float | None = getattr(conn, "call_timeout", None)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        state = conn.poll()
        if state == psycopg2.extensions.POLL_OK:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            with contextlib.suppress(OSError), socket.fromfd(conn.fileno(), socket.AF_INET, socket.SOCK_STREAM) as s:
                s.shutdown(socket.SHUT_RDWR)
            raise CallTimeout(f"no answer within {timeout:g}s; dupguard closed the connection")
        if state == psycopg2.extensions.POLL_READ:
            select.select([conn.fileno()], [], [], left)
        elif state == psycopg2.extensions.POLL_WRITE:
            select.select([], [conn.fileno()], [], left)
        else:  # pragma: no cover - psycopg2 documents only the states above
            raise psycopg2.OperationalError(f"unexpected poll state {state}")


def _timed_connection(call_timeout: float) -> type[psycopg2.extensions.connection]:
    return type("DupguardConnection", (psycopg2.extensions.connection,), {"call_timeout": call_timeout})


def make_engine(
    url: URL,
    *,
    connect_timeout: float = 5.0,
    pool_size: int = 2,
    read_only: bool = False,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
) -> Engine:
    """An engine with timeouts on: a hung database must never hang dupguard.

    ``read_only`` opens a SQLite file with ``mode=ro``: reading a wrong path must neither create an
    empty file nor change a real one (``scan`` and ``run`` only read).

    Every round trip (connect included) has a client-side deadline, ``call_timeout`` (see
    ``_wait_with_deadline``). No ``options``/``SET`` at connect: PgBouncer rejects the startup
    parameter, and in transaction pooling a session SET would leak into Airflow's own connections.
    TCP keepalives and ``tcp_user_timeout`` (libpq parameters, fine through PgBouncer) detect a dead
    server in ~9 s.
    """
    if url.get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if read_only and path is not None:
            uri = f"file:{quote(str(path.absolute()))}?mode=ro"

            # check_same_thread off, as SQLAlchemy sets it for file databases it opens itself: its
            # QueuePool hands one connection to one thread at a time, but not always the thread that
            # made it (a worker's connection back in the pool, then the poll's), which sqlite3's
            # default refuses: "SQLite objects created in a thread can only be used in that same thread".
            def open_read_only() -> sqlite3.Connection:
                return sqlite3.connect(uri, uri=True, timeout=connect_timeout, check_same_thread=False)

            return create_engine(url, creator=open_read_only)
        return create_engine(url, connect_args={"timeout": connect_timeout})
    # Process-wide (psycopg2 has one wait callback); connections without ``call_timeout`` wait unbounded.
    psycopg2.extensions.set_wait_callback(_wait_with_deadline)
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=2,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={
            "connection_factory": _timed_connection(call_timeout),
            "connect_timeout": max(1, int(connect_timeout)),
            "application_name": "dupguard",
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 2,
            "tcp_user_timeout": 9000,
        },
    )


def describe_error(exc: BaseException, url: URL) -> str:
    """One line an operator can act on, without the password.

    The URL is rendered by parsing (``redact``); the driver's own text cannot be parsed, so it is
    withheld whole if it contains one of the URL's secrets.
    """
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        detail = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    else:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    path = sqlite_path(url) if url.get_backend_name() == "sqlite" else None
    if path is not None and not path.exists():
        detail = "no such file"
    return f"database {redact(url)}: {_redact.withhold(detail, _redact.url_secrets(url))}"


@contextlib.contextmanager
def connect(engine: Engine) -> Iterator[Connection]:
    """A connection whose SQLAlchemy errors surface as ``DatabaseError`` with a redacted message."""
    try:
        with engine.connect() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise DatabaseError(describe_error(exc, engine.url)) from None


@dataclass(frozen=True)
class AirflowDb:
    """What dupguard learned about one metadata database at start-up."""

    engine: Engine
    info: SchemaInfo
    tables: AirflowTables


def open_airflow_db(engine: Engine) -> AirflowDb:
    """Identify the schema behind ``engine``; raises DatabaseError / UnsupportedSchema."""
    with connect(engine) as conn:
        revision = catalog.alembic_revision(conn)
        columns = catalog.table_columns(conn, _FAMILY_TABLES)
    info = identify(revision, columns)
    return AirflowDb(engine=engine, info=info, tables=airflow_tables(info.family))


# Round trips of the pinning proof: each one another chance for a pooler to show itself. Not 3: behind
# transaction pooling a busy neighbour that releases its server session between our commit and the
# second client's transaction sends that client to the neighbour's session, and ours comes back to us:
# one round fooled. CI saw all 3 rounds fooled once (test_lock_pinning, pool of 20, a busy neighbour).
PIN_ROUNDS = 8


def is_pinned(conn: Connection) -> bool:
    """True when ``conn``'s transactions are proven to reach one server session (direct, a plain TCP
    proxy, PgBouncer's session pooling); False behind transaction or statement pooling.

    Proof, not inference from addresses (on one host a pooler's ephemeral port can equal
    the client's): a session variable (``leader_lock.mark_session``) is set with a fresh nonce in one
    transaction; then, ``PIN_ROUNDS`` times, a second client of the same URL runs a transaction, and
    ``conn`` runs another. Pinned only if ``conn`` always finds its backend pid and nonce and the other
    client never does. A pooler that hands server sessions out per transaction gives the session ``conn``
    just released to the next client (PgBouncer reuses the most recent one; with a pool of one there is
    no other), so the other client lands on it and the proof fails; round-robin hands ``conn`` another
    session and it fails on ``conn``'s side. A second client that cannot connect proves nothing: False.
    The variable (``dupguard.pin_check``) is inert; behind transaction pooling it stays on a server
    session Airflow may use, where nothing reads it. Commits ``conn``'s current transaction.
    """
    nonce = secrets.token_hex(8)
    pid = leader_lock.mark_session(conn, nonce)
    conn.commit()
    try:
        other = conn.engine.connect()
    except SQLAlchemyError:
        return False
    try:
        for _ in range(PIN_ROUNDS):
            try:
                seen = leader_lock.session_mark(other)
                other.commit()
            except SQLAlchemyError:
                return False
            if seen[0] == pid or seen[1] == nonce:
                return False  # our server session served another client
            again = leader_lock.session_mark(conn)
            conn.commit()
            if again != (pid, nonce):
                return False  # our next transaction ran in another server session
        return True
    finally:  # closed, never pooled: no idle connection kept for a check made once per reconnect
        with contextlib.suppress(SQLAlchemyError):
            other.invalidate()
        other.close()


@dataclass(frozen=True)
class ServerRole:
    """What a connection reached: a primary, or a standby replaying WAL (a hot standby, a reader endpoint)."""

    standby: bool
    replay_lag_seconds: float | None = None  # a standby's; None when unknown (nothing replayed yet)

    def describe(self) -> str:
        if not self.standby:
            return "primary"
        lag = "unknown" if self.replay_lag_seconds is None else f"{self.replay_lag_seconds:.1f} s"
        return f"standby (in recovery, replay lag {lag})"

    def as_dict(self) -> dict[str, Any]:
        return {"role": "standby" if self.standby else "primary", "replay_lag_seconds": self.replay_lag_seconds}


def server_role(conn: Connection) -> ServerRole | None:
    """The server ``conn`` reached (``leader_lock.recovery_status``); None for SQLite, which has no standby."""
    if conn.dialect.name != "postgresql":
        return None
    standby, lag = leader_lock.recovery_status(conn)
    return ServerRole(standby=standby, replay_lag_seconds=None if lag is None else round(lag, 3))


def refuse_standby(conn: Connection, setting: str, use: str) -> None:
    """Raise ``DatabaseError`` when ``conn`` reached a server in recovery: ``use`` (what dupguard was about
    to do) must never rely on a copy that may lag the primary. The message names ``setting``."""
    if conn.dialect.name == "postgresql" and leader_lock.in_recovery(conn):
        raise DatabaseError(
            f"database {redact(conn.engine.url)} is a hot standby (in recovery, it may lag the primary): "
            f"dupguard never {use} there; set {setting} to the primary (a writer endpoint, not a reader "
            "endpoint; a multi-host URL needs target_session_attrs=read-write)"
        )

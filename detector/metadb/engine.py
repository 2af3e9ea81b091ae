"""Engines for Airflow's metadata database: URL normalisation, redaction, timeouts, error wrapping."""

from __future__ import annotations

import contextlib
import ipaddress
import select
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import psycopg2
import psycopg2.extensions
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from detector import redact as _redact
from detector.errors import ConfigError, DatabaseError
from detector.metadb import queries
from detector.metadb.schema import AirflowTables, airflow_tables
from detector.metadb.versions import SchemaInfo, identify

_POSTGRES_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg2"}
_FAMILY_TABLES = ("dag_run", "asset_partition_dag_run")


def parse_url(raw: str) -> URL:
    """A SQLAlchemy URL for Airflow's metadata DB; ``postgres://`` and driverless URLs use psycopg2.

    A raw ``@`` in the password is split at the last ``@`` (as ``urllib.parse`` and libpq do):
    SQLAlchemy splits at the first, which would send the password's tail to DNS as a host name.
    """
    text = raw.strip()
    try:
        text = _escape_userinfo(text)
        url = make_url(text)
        _ = url.port  # a non-numeric port raises here or in make_url
    except (ArgumentError, ValueError):
        raise ConfigError([_why_not_a_url(text)]) from None
    if url.drivername in _POSTGRES_SCHEMES:
        return url.set(drivername="postgresql+psycopg2")
    if url.drivername in {"sqlite", "sqlite+pysqlite"}:
        return url
    raise ConfigError([f"database URL scheme {url.drivername!r} is not supported (postgresql:// or sqlite:///)"])


def _escape_userinfo(text: str) -> str:
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.startswith("sqlite"):
        return text
    netloc_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc = rest[:netloc_end]
    if netloc.count("@") < 2:
        return text
    userinfo, _, hostport = netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    escaped = quote(user, safe="%") + colon + quote(password, safe="%")
    return f"{scheme}://{escaped}@{hostport}{rest[netloc_end:]}"


def _why_not_a_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        _ = parts.port
    except ValueError:
        return "database URL has an invalid host or port (the port must be a number 1-65535)"
    return "database URL is not a URL (expected postgresql://user:pass@host:5432/db or sqlite:////path/airflow.db)"


def redact(url: URL | str) -> str:
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
            return create_engine(url, creator=lambda: sqlite3.connect(uri, uri=True, timeout=connect_timeout))
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
        revision = queries.alembic_revision(conn)
        columns = queries.table_columns(conn, _FAMILY_TABLES)
    info = identify(revision, columns)
    return AirflowDb(engine=engine, info=info, tables=airflow_tables(info.family))


def is_direct(conn: Connection) -> bool | None:
    """True if the server's view of its client is this very socket; None for a Unix socket.

    Any proxy or pooler (PgBouncer in any pool mode, Pgpool, a cloud SQL proxy) connects to the server
    from its own socket, so it never passes for direct (``detector.app.leader``, ``detector.metadb.prepared``).
    """
    addr, port = queries.client_endpoint(conn)
    fd = conn.connection.dbapi_connection.fileno()  # type: ignore[union-attr]
    with socket.socket(fileno=socket.dup(fd)) as own:
        local = own.getsockname()
    if addr is None or port is None or not isinstance(local, tuple):
        return None
    return _same_ip(str(addr), str(local[0])) and int(port) == int(local[1])


def _same_ip(a: str, b: str) -> bool:
    def norm(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        ip = ipaddress.ip_address(text.split("%", 1)[0].split("/", 1)[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        return ip

    try:
        return norm(a) == norm(b)
    except ValueError:
        return False

"""Engines for Airflow's metadata database: URL normalisation, redaction, timeouts, error wrapping."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError

from detector import queries
from detector.errors import ConfigError, DatabaseError
from detector.schema import AirflowTables, airflow_tables
from detector.versions import SchemaInfo, identify

_POSTGRES_SCHEMES = {"postgresql", "postgres", "postgresql+psycopg2"}
_FAMILY_TABLES = ("dag_run", "asset_partition_dag_run")


def parse_url(raw: str) -> URL:
    """A SQLAlchemy URL for Airflow's metadata DB; ``postgres://`` and driverless URLs use psycopg2."""
    try:
        url = make_url(raw.strip())
    except ArgumentError:
        raise ConfigError(["database URL is not a URL (expected postgresql://user:pass@host:5432/db)"]) from None
    if url.drivername in _POSTGRES_SCHEMES:
        return url.set(drivername="postgresql+psycopg2")
    if url.drivername in {"sqlite", "sqlite+pysqlite"}:
        return url
    raise ConfigError([f"database URL scheme {url.drivername!r} is not supported (postgresql:// or sqlite:///)"])


def redact(url: URL | str) -> str:
    """The URL as text with any password masked: safe for logs and error messages."""
    parsed = url if isinstance(url, URL) else make_url(url)
    return parsed.render_as_string(hide_password=True)


def scrub(message: str, url: URL) -> str:
    """``message`` with the URL's password removed, whatever the driver echoed back."""
    if url.password:
        message = message.replace(str(url.password), "***")
    return message


def make_engine(url: URL, *, connect_timeout: float = 5.0, pool_size: int = 2) -> Engine:
    """An engine with timeouts on: a hung database must never hang dupguard.

    No ``options``/``SET`` at connect: PgBouncer rejects the startup parameter, and in transaction
    pooling a session SET would leak into Airflow's own connections. TCP keepalives and
    ``tcp_user_timeout`` (libpq parameters, fine through PgBouncer) detect a dead server in ~9 s.
    """
    if url.get_backend_name() == "sqlite":
        return create_engine(url, connect_args={"timeout": connect_timeout})
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=2,
        pool_pre_ping=True,
        pool_recycle=1800,
        connect_args={
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
    """One line an operator can act on, without the password."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        detail = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    else:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return scrub(f"database {redact(url)}: {detail}", url)


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

"""The server and its catalog, read by every mode: its clock, a ping, which tables, columns and grants exist.

SQLAlchemy Core; read-only; no string-built SQL."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from sqlalchemy import (
    Connection,
    func,
    inspect,
    literal,
    select,
)
from sqlalchemy.exc import NoSuchTableError

from detector.metadb.schema import alembic_version_table

# --- schema identification -------------------------------------------------------------------


def alembic_revision(conn: Connection) -> str | None:
    """The alembic head Airflow stamped, or None when the table is missing or empty."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(select(alembic_version_table().c.version_num).limit(1)).scalar_one_or_none()


def table_columns(conn: Connection, tables: Iterable[str]) -> dict[str, set[str]]:
    """``{table: {column names}}`` for the tables that exist."""
    inspector = inspect(conn)
    found: dict[str, set[str]] = {}
    for name in tables:
        try:
            found[name] = {c["name"] for c in inspector.get_columns(name)}
        except NoSuchTableError:
            continue
    return found


def database_now(conn: Connection) -> datetime:
    """The database server's clock: ages of Airflow's timestamps are measured on the clock
    that wrote them, never on this host's (10 minutes off re-alerted old groups at start). SQLite has no
    server: its clock is this host's, the one ``airflow standalone`` on this host writes with too."""
    if conn.dialect.name == "sqlite":
        return datetime.now(UTC)
    now: datetime = conn.execute(select(func.now())).scalar_one()
    return now


def ping(conn: Connection) -> None:
    """The cheapest round trip: readiness, the database-up gauge, the leader's heartbeat."""
    conn.execute(select(literal(1)))


def existing_tables(conn: Connection, names: Iterable[str]) -> set[str]:
    """Which of ``names`` (``schema.table`` or a table of the default schema) exist."""
    inspector = inspect(conn)
    found = set()
    for name in names:
        schema, _, bare = name.rpartition(".")
        if inspector.has_table(bare, schema=schema or None):
            found.add(name)
    return found


def table_privileges(conn: Connection, checks: Sequence[tuple[str, str]]) -> list[bool]:
    """For each ``(table, privilege)`` whether the connected role holds it (``has_table_privilege``);
    the tables must exist. SQLite has no privileges: all True."""
    if not checks:
        return []
    if conn.dialect.name != "postgresql":
        return [True for _ in checks]
    row = conn.execute(select(*[func.has_table_privilege(literal(t), literal(p)) for t, p in checks])).one()
    return [bool(v) for v in row]

"""The daemon's idle probe, "is there a run above the watermark?", as cheap as PostgreSQL allows.

The daemon asks this at every idle pass (at rest a few times a second, while a race is possible every
few milliseconds) and the answer is almost always "no". The same statement returns a fingerprint of
Airflow's asset queues (``dag_runs.top_run_and_queues_statement``): the daemon polls fast while it
changes (``detector.core.pace``). Sent as text, every statement is parsed, analysed and planned again: two thirds of its
backend's CPU (``perf`` on the backend, benchmarks/results/measurements.md), and SQLAlchemy's execution path was most
of dupguard's own CPU per poll. So, on PostgreSQL, the probe (``dag_runs.top_run_and_queues_statement``,
compiled once) is ``PREPARE``d once per poll connection and then ``EXECUTE``d on one psycopg2 cursor
held with it: a statement without parameters is planned once (PostgreSQL uses its generic plan at
once), and the client path is libpq's. The driver's wait callback still bounds every call
(``detector.metadb.engine``), and driver errors surface as ``DatabaseError`` like SQLAlchemy's.

Only on a session proven pinned (``engine.is_pinned``: direct, a plain TCP proxy, PgBouncer's session
pooling): a prepared statement lives in one server session, and behind transaction pooling the next
statement may land on another server connection. Elsewhere (transaction or statement pooling, SQLite)
the same Core statement is sent through SQLAlchemy, unprepared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg2
from psycopg2 import sql as pgsql
from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from detector.errors import DatabaseError
from detector.metadb import dag_runs
from detector.metadb.engine import describe_error, is_pinned
from detector.metadb.schema import AirflowTables

PROBE_NAME = "dupguard_top_run_id"

TopRunId = Callable[[], int]  # the highest visible dag_run id, 0 on an empty table
# The highest visible dag_run id and the asset queues' fingerprint (``dag_runs.top_run_and_queues``).
QueueProbe = Callable[[], tuple[int, tuple[Any, ...]]]


INSUFFICIENT_PRIVILEGE = "42501"


def queues_unreadable(conn: Connection, t: AirflowTables) -> str | None:
    """Why this role cannot read the asset queues' fingerprint (None: it can). A role granted only what the
    poll of new runs needs (an older install's grants) still polls: the probe then reads the top id alone,
    and a race is noticed by its first run instead of its queue row. ``conn`` is in autocommit, so the
    refused statement leaves nothing to roll back."""
    try:
        dag_runs.top_run_and_queues(conn, t)
    except DBAPIError as exc:
        if getattr(exc.orig, "pgcode", None) != INSUFFICIENT_PRIVILEGE:
            raise DatabaseError(describe_error(exc, conn.engine.url)) from None
        tables = ", ".join(table.name for table in (t.asset_queue, t.partition_dag_run) if table is not None)
        first_line = str(exc.orig).strip().splitlines()[0]
        return f"{first_line}: GRANT SELECT ON {tables} TO the dupguard role to poll fast only while a race is possible"
    return None


def top_run_id_probe(conn: Connection, t: AirflowTables, queues: bool = True) -> tuple[QueueProbe, bool]:
    """A probe bound to ``conn`` (which must stay open as long as the probe is used), and whether it
    is prepared on the server. ``queues``: with the asset queues' fingerprint (``queues_unreadable``)."""
    if conn.dialect.name != "postgresql" or not is_pinned(conn):
        return (lambda: dag_runs.top_run_and_queues(conn, t, queues)), False
    raw = conn.connection.dbapi_connection
    assert raw is not None  # an open Connection always has its driver connection
    statement = str(
        dag_runs.top_run_and_queues_statement(t, queues).compile(
            dialect=conn.dialect, compile_kwargs={"literal_binds": True}
        )
    )
    cursor = raw.cursor()
    name = pgsql.Identifier(PROBE_NAME)
    url = conn.engine.url
    try:
        cursor.execute(pgsql.SQL("PREPARE {} AS {}").format(name, pgsql.SQL(statement)).as_string(raw))
    except psycopg2.Error as exc:
        raise DatabaseError(describe_error(exc, url)) from None
    execute = pgsql.SQL("EXECUTE {}").format(name).as_string(raw)

    def probe() -> tuple[int, tuple[Any, ...]]:
        try:
            cursor.execute(execute)
            row = cursor.fetchone()
        except psycopg2.Error as exc:
            raise DatabaseError(describe_error(exc, url)) from None
        return (int(row[0] or 0), tuple(row[1:])) if row is not None else (0, ())

    return probe, True

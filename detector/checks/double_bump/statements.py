"""What the double_bump check reads (docs/explanation/airflow-internals.md, "Task attempts bumped twice"): its tables
(``BumpTables``: Airflow 3's ``task_instance`` by id, ``task_instance_history``, the scheduler jobs) and the tries
they record.
SQLAlchemy Core; read-only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    Row,
    Select,
    String,
    Table,
    Uuid,
    and_,
    column,
    func,
    inspect,
    or_,
    select,
    table,
    tuple_,
)

from detector.checks.double_bump.rule import IN_FLIGHT, SchedulerJob, TiKey, TiRow
from detector.metadb.batches import chunks
from detector.metadb.schema import UtcDateTime, job_table


@dataclass(frozen=True)
class BumpTables:
    """What the double_bump check reads (docs/explanation/airflow-internals.md, "Task attempts bumped twice"),
    Airflow 3 only: task instances by their 3.x ``id``, their tries recorded in ``task_instance_history``, the run's
    ``queued_at`` and the scheduler ``job`` rows."""

    task_instance: Table
    history: Table
    dag_run: Table
    job: Table


def bump_tables() -> BumpTables:
    md = MetaData()
    key = [Column(n, String(250)) for n in ("dag_id", "task_id", "run_id")] + [Column("map_index", Integer)]
    return BumpTables(
        task_instance=Table(
            "task_instance",
            md,
            Column("id", Uuid, primary_key=True),
            *key,
            Column("try_number", Integer),
            Column("state", String(20)),
            Column("hostname", String(1000)),
            Column("queued_by_job_id", Integer),
            Column("scheduled_dttm", UtcDateTime),
            Column("dag_version_id", Uuid),
        ),
        history=Table(
            "task_instance_history",
            md,
            *[Column(c.name, c.type) for c in key],
            Column("try_number", Integer),
        ),
        dag_run=Table(
            "dag_run",
            md,
            Column("id", Integer, primary_key=True),
            Column("dag_id", String(250)),
            Column("run_id", String(250)),
            Column("queued_at", UtcDateTime),
        ),
        job=job_table(md),
    )


# --- double_bump (docs/explanation/airflow-internals.md, "Task attempts bumped twice") ---------------------------


def _ti_select(bt: BumpTables) -> Select[Any]:
    ti, dr = bt.task_instance, bt.dag_run
    on = and_(dr.c.dag_id == ti.c.dag_id, dr.c.run_id == ti.c.run_id)  # dag_run_dag_id_run_id_key
    return select(*ti.c, dr.c.queued_at).select_from(ti.outerjoin(dr, on))


def _ti_row(row: Row[Any]) -> TiRow:
    return TiRow(
        id=str(row.id),
        dag_id=row.dag_id,
        task_id=row.task_id,
        run_id=row.run_id,
        map_index=row.map_index,
        try_number=row.try_number or 0,
        state=row.state,
        hostname=row.hostname or None,
        queued_by_job_id=row.queued_by_job_id,
        scheduled_dttm=row.scheduled_dttm,
        dag_version_id=None if row.dag_version_id is None else str(row.dag_version_id),
        run_queued_at=row.queued_at,
    )


def in_flight_tis(conn: Connection, bt: BumpTables) -> list[TiRow]:
    """Task instances scheduled, queued or running (index ti_state): a live pass's view and memory."""
    return [_ti_row(r) for r in conn.execute(in_flight_statement(bt))]


def in_flight_statement(bt: BumpTables) -> Select[Any]:
    return _ti_select(bt).where(bt.task_instance.c.state.in_(sorted(IN_FLIGHT)))


def tis_missing_history(conn: Connection, bt: BumpTables, since: datetime | None) -> list[TiRow]:
    """TIs at try n >= 2 with fewer than n - 1 history rows below n (a scan: task_instance has no
    index on try_number, so this reads the table once; each count is a range of the history table's
    unique key task_instance_history_dtrt_uq). ``since``: scheduled at or after it (db clock)."""
    return [_ti_row(r) for r in conn.execute(tis_missing_history_statement(bt, since))]


def tis_missing_history_statement(bt: BumpTables, since: datetime | None) -> Select[Any]:
    ti, tih = bt.task_instance, bt.history
    recorded = (
        select(func.count())
        .where(
            tih.c.dag_id == ti.c.dag_id,
            tih.c.task_id == ti.c.task_id,
            tih.c.run_id == ti.c.run_id,
            tih.c.map_index == ti.c.map_index,
            tih.c.try_number < ti.c.try_number,
        )
        .scalar_subquery()
    )
    query = _ti_select(bt).where(ti.c.try_number >= 2, ti.c.dag_version_id.is_not(None), recorded < ti.c.try_number - 1)
    if since is not None:
        query = query.where(ti.c.scheduled_dttm >= since)
    return query


def history_tries(conn: Connection, bt: BumpTables, keys: Iterable[TiKey]) -> dict[TiKey, frozenset[int]]:
    """The tries each TI key has a task_instance_history row for (unique key task_instance_history_dtrt_uq)."""
    tih = bt.history
    cols = (tih.c.dag_id, tih.c.task_id, tih.c.run_id, tih.c.map_index)
    found: dict[TiKey, set[int]] = defaultdict(set)
    for part in chunks(sorted(set(keys))):
        for r in conn.execute(select(*cols, tih.c.try_number).where(tuple_(*cols).in_(list(part)))):
            found[(r.dag_id, r.task_id, r.run_id, r.map_index)].add(r.try_number)
    return {k: frozenset(v) for k, v in found.items()}


def scheduler_jobs(
    conn: Connection, bt: BumpTables, ids: Iterable[int], dead_since: datetime | None
) -> list[SchedulerJob]:
    """The scheduler jobs among ``ids`` (job PK), those not running that heartbeat after ``dead_since``
    (every one when None; index job_type_heart) and those started since: who queued, who was declared
    dead, whose first loop ran an orphan check."""
    job = bt.job
    base = select(
        job.c.id, job.c.state, job.c.latest_heartbeat, job.c.hostname, job.c.start_date, job.c.end_date
    ).where(job.c.job_type == "SchedulerJob")
    rows: dict[int, Row[Any]] = {}
    for part in chunks(sorted(set(ids))):
        rows |= {r.id: r for r in conn.execute(base.where(job.c.id.in_(part)))}
    dead = base.where(job.c.state.is_distinct_from("running"))
    if dead_since is not None:
        dead = base.where(
            or_(and_(job.c.state.is_distinct_from("running"), job.c.latest_heartbeat >= dead_since),
                job.c.start_date >= dead_since)
        )  # fmt: skip
    rows |= {r.id: r for r in conn.execute(dead)}
    return [
        SchedulerJob(r.id, r.state, r.latest_heartbeat, r.hostname, r.start_date, r.end_date) for r in rows.values()
    ]


HISTORY_ARCHIVE_PREFIX = "_airflow_deleted__task_instance_history__"  # airflow/utils/db_cleanup.py L220


def history_purges(conn: Connection) -> tuple[datetime, ...]:
    """When `airflow db clean` moved task_instance_history rows away: its archive tables'
    names carry the UTC time it ran (``..._history__YYYYMMDDHHMMSS[__bN]``); none with --skip-archive."""
    out = set()
    if conn.dialect.name == "postgresql":  # the catalog, not the inspector's per-table reflection (~30 ms)
        rel = table("pg_class", column("relname"), column("relkind"), schema="pg_catalog")
        query = select(rel.c.relname).where(
            rel.c.relkind == "r", rel.c.relname.startswith(HISTORY_ARCHIVE_PREFIX, autoescape=True)
        )
        names = list(conn.execute(query).scalars())
    else:
        names = inspect(conn).get_table_names()
    for name in names:
        stamp = name[len(HISTORY_ARCHIVE_PREFIX) :][:14] if name.startswith(HISTORY_ARCHIVE_PREFIX) else ""
        if len(stamp) == 14 and stamp.isdigit():
            out.add(datetime.strptime(stamp, "%Y%m%d%H%M%S").replace(tzinfo=UTC))
    return tuple(sorted(out))

"""Every query dupguard sends to Airflow's metadata database, named for what it fetches.

SQLAlchemy Core over the tables declared in ``detector.metadb.schema``; read-only; no string-built SQL.
Rows become frozen ``detector.core.model`` objects here, at the boundary. The index each query relies
on is named beside it (docs/explanation/airflow-internals.md §1.5).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    Integer,
    Interval,
    Row,
    Select,
    and_,
    bindparam,
    case,
    column,
    func,
    inspect,
    literal,
    null,
    or_,
    select,
    table,
    tuple_,
    union,
)
from sqlalchemy.dialects.postgresql import OID
from sqlalchemy.exc import NoSuchTableError

from detector.core.model import ASSET_TRIGGERED, GUARD_NOTE_PREFIX, PartitionRow, Run, TaskProgress, ti_started
from detector.core.trigger_event import TriggerEvent, trigger_event
from detector.metadb.schema import AirflowTables, UtcDateTime, alembic_version_table

CHUNK = 500  # ids per IN list: keeps statements small on every backend
T = TypeVar("T")


def chunks(items: Sequence[T], size: int = CHUNK) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


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


# --- dag runs ----------------------------------------------------------------------------------


def _run_select(t: AirflowTables) -> Select[Any]:
    dr, job = t.dag_run, t.job
    cols = [
        dr.c.id,
        dr.c.dag_id,
        dr.c.run_id,
        dr.c.run_type,
        dr.c.run_after,
        dr.c.state,
        dr.c.creating_job_id,
        job.c.hostname,
        dr.c.queued_at,
    ]
    if t.family.has_partitions:
        cols.append(dr.c.partition_key)
    return select(*cols).select_from(dr.outerjoin(job, job.c.id == dr.c.creating_job_id))


def _run(row: Row[Any]) -> Run:
    m = row._mapping
    return Run(
        id=m["id"],
        dag_id=m["dag_id"],
        run_id=m["run_id"],
        run_type=m["run_type"],
        run_after=m["run_after"],
        state=m["state"],
        partition_key=m.get("partition_key"),
        creating_job_id=m["creating_job_id"],
        creator_hostname=m["hostname"],
        queued_at=m["queued_at"],
    )


@functools.cache
def top_run_id_statement(t: AirflowTables) -> Select[Any]:
    """``max(dag_run.id)``: one backward step of dag_run_pkey. Also the daemon's idle probe, prepared once
    on its poll connection (``detector.metadb.prepared``): no parameters, so PostgreSQL plans it once."""
    return select(func.max(t.dag_run.c.id))


def max_run_id(conn: Connection, t: AirflowTables) -> int:
    """Highest dag_run id (dag_run_pkey), 0 on an empty table."""
    return int(conn.execute(top_run_id_statement(t)).scalar_one_or_none() or 0)


def min_run_id(conn: Connection, t: AirflowTables) -> int | None:
    """Lowest dag_run id still in the table (dag_run_pkey); rows below it were deleted (``airflow db clean``)."""
    value = conn.execute(select(func.min(t.dag_run.c.id))).scalar_one_or_none()
    return None if value is None else int(value)


def queued_at_of_ids(
    conn: Connection, t: AirflowTables, first: int, last: int
) -> tuple[datetime | None, datetime | None]:
    """``queued_at`` of the lowest and the highest run with an id in [first, last] (two pkey steps)."""
    dr = t.dag_run
    edge = select(dr.c.queued_at).where(dr.c.id.between(first, last)).limit(1)
    row = conn.execute(
        select(edge.order_by(dr.c.id).scalar_subquery(), edge.order_by(dr.c.id.desc()).scalar_subquery())
    ).one()
    return row[0], row[1]


def database_now(conn: Connection) -> datetime:
    """The database server's clock (issue 23 §6): ages of Airflow's timestamps are measured on the clock
    that wrote them, never on this host's (10 minutes off re-alerted old groups at start). SQLite has no
    server: its clock is this host's, the one ``airflow standalone`` on this host writes with too."""
    if conn.dialect.name == "sqlite":
        return datetime.now(UTC)
    now: datetime = conn.execute(select(func.now())).scalar_one()
    return now


@functools.cache
def _new_runs_statement(t: AirflowTables, with_gaps: bool) -> Select[Any]:
    # Built once: the daemon runs this every poll, and constructing a Select costs more than the
    # index probe it sends.
    dr = t.dag_run
    above = dr.c.id > bindparam("above")
    condition = or_(above, dr.c.id.in_(bindparam("gaps", expanding=True))) if with_gaps else above
    return _run_select(t).where(condition).order_by(dr.c.id).limit(bindparam("limit"))


def new_runs(conn: Connection, t: AirflowTables, above: int, gaps: Sequence[int], limit: int) -> list[Run]:
    """Runs with id > ``above`` or id in ``gaps``, by id: the daemon's tail (dag_run_pkey only).

    ``gaps`` are ids below ``above`` that were not visible yet: their transactions may still commit.
    """
    params: dict[str, Any] = {"above": above, "limit": limit}
    if gaps:
        params["gaps"] = list(gaps)
    return [_run(r) for r in conn.execute(_new_runs_statement(t, bool(gaps)), params)]


def unfinished_asset_runs(conn: Connection, t: AirflowTables, above: int, upto: int, limit: int) -> list[Run]:
    """Asset runs with ``above`` < id <= ``upto`` still queued or running: the only ones a stop can
    still act on. Airflow's partial indexes on queued and running runs (idx_dag_run_queued_dags,
    idx_dag_run_running_dags) and dag_run_pkey answer it without reading finished history."""
    dr = t.dag_run
    query = (
        _run_select(t)
        .where(
            dr.c.id > above,
            dr.c.id <= upto,
            dr.c.run_type == ASSET_TRIGGERED,
            dr.c.state.in_(("queued", "running")),
        )
        .order_by(dr.c.id)
        .limit(limit)
    )
    return [_run(r) for r in conn.execute(query)]


def first_run_id_since(conn: Connection, t: AirflowTables, since: datetime, not_below: int) -> int | None:
    """Lowest id > not_below of a run queued at or after ``since`` (pkey range, bounded by not_below)."""
    dr = t.dag_run
    query = select(func.min(dr.c.id)).where(dr.c.id > not_below, dr.c.queued_at >= since)
    value = conn.execute(query).scalar_one_or_none()
    return None if value is None else int(value)


def sibling_runs(
    conn: Connection, t: AirflowTables, run: Run, event_ids: Iterable[int], window: timedelta
) -> list[Run]:
    """Asset-triggered runs of run's DAG that could share its trigger.

    One UNION arm per way of being a sibling, so each is answered from an index: the same run_after
    (idx_dag_run_run_after), a shared consumed event (dagrun_asset_event.event_id -> dag_run_pkey),
    and, for partitioned runs, the same partition key within ``window`` (run_after range). An OR of
    the three made PostgreSQL read every run of the DAG: 55 ms at 10M rows instead of 0.5 ms
    (benchmarks/poll_cost.py, benchmarks/results/measurements.md).
    """
    dr, rev = t.dag_run, t.run_events
    base = _run_select(t).where(dr.c.dag_id == run.dag_id, dr.c.run_type == ASSET_TRIGGERED)
    arms = [base.where(dr.c.run_after == run.run_after)]
    events = sorted(event_ids)
    if events:
        arms.append(base.where(dr.c.id.in_(select(rev.c.dag_run_id).where(rev.c.event_id.in_(events)))))
    if t.family.has_partitions and run.partition_key is not None:
        arms.append(
            base.where(
                dr.c.run_after.between(run.run_after - window, run.run_after + window),
                dr.c.partition_key == run.partition_key,
            )
        )
    return [_run(r) for r in conn.execute(union(*arms))]


def candidate_asset_keys(conn: Connection, t: AirflowTables, since: datetime | None) -> list[tuple[str, datetime]]:
    """(dag_id, run_after) shared by more than one non-partitioned asset run (idx_dag_run_run_after)."""
    dr = t.dag_run
    query = select(dr.c.dag_id, dr.c.run_after).where(dr.c.run_type == ASSET_TRIGGERED)
    if since is not None:
        query = query.where(dr.c.run_after >= since)
    if t.family.has_partitions:
        query = query.where(dr.c.partition_key.is_(None))
    query = query.group_by(dr.c.dag_id, dr.c.run_after).having(func.count() > 1)
    return [(r.dag_id, r.run_after) for r in conn.execute(query)]


def candidate_partition_keys(conn: Connection, t: AirflowTables, since: datetime | None) -> list[tuple[str, str]]:
    """(dag_id, partition_key) with more than one asset run since ``since``."""
    if not t.family.has_partitions:
        return []
    dr = t.dag_run
    query = select(dr.c.dag_id, dr.c.partition_key).where(
        dr.c.run_type == ASSET_TRIGGERED, dr.c.partition_key.is_not(None)
    )
    if since is not None:
        query = query.where(dr.c.run_after >= since)
    query = query.group_by(dr.c.dag_id, dr.c.partition_key).having(func.count() > 1)
    return [(r.dag_id, r.partition_key) for r in conn.execute(query)]


def runs_sharing_events(conn: Connection, t: AirflowTables, since: datetime | None) -> list[Run]:
    """Non-partitioned asset runs that consumed an event another asset run of their DAG consumed too.

    Legitimate runs of one DAG never share an event (detector/core/detect.py): this is the overlap race,
    whose runs differ in run_after. One GROUP BY (dag_id, event_id) over the consumed events of the
    asset runs since ``since`` (idx_dag_run_run_after, then dagrun_asset_event_pkey); over all history
    only over the events consumed more than once (idx_dagrun_asset_events_event_id).
    """
    dr, rev = t.dag_run, t.run_events
    asset_run = [dr.c.run_type == ASSET_TRIGGERED]
    if since is not None:
        asset_run.append(dr.c.run_after >= since)
    if t.family.has_partitions:
        asset_run.append(dr.c.partition_key.is_(None))
    consumed = (
        select(
            rev.c.dag_run_id,
            func.count().over(partition_by=(dr.c.dag_id, rev.c.event_id)).label("consumers"),
        )
        .select_from(rev.join(dr, dr.c.id == rev.c.dag_run_id))
        .where(*asset_run)
    )
    if since is None:
        # All history: only events consumed more than once at all (fan-out to several DAGs keeps this
        # small), streamed from the event_id index; joining every consumed event to its run first
        # made PostgreSQL hash-aggregate the whole table (18 s at 1M, benchmarks/scan_cost.py).
        repeated = select(rev.c.event_id).group_by(rev.c.event_id).having(func.count() > 1)
        consumed = consumed.where(rev.c.event_id.in_(repeated))
    shared = consumed.subquery()
    # The ids first, then their rows by primary key: as one statement the planner, expecting far more
    # ids than the few there are, read all of dag_run to join them.
    ids = sorted(set(conn.execute(select(shared.c.dag_run_id).where(shared.c.consumers > 1)).scalars()))
    runs: list[Run] = []
    for part in chunks(ids):
        runs.extend(_run(r) for r in conn.execute(_run_select(t).where(dr.c.id.in_(part))))
    return runs


def _trigger_events(rows: Iterable[Row[Any]]) -> list[TriggerEvent]:
    found = (trigger_event(r.id, r.asset_id, r.timestamp, r.extra, r.source_dag_id) for r in rows)
    return [e for e in found if e is not None]


def _trigger_event_select(t: AirflowTables) -> Select[Any]:
    """Events no task wrote (a trigger's, or the REST API's): only those carry a trigger's extra."""
    ae = t.asset_event
    return select(ae.c.id, ae.c.asset_id, ae.c.timestamp, ae.c.extra, ae.c.source_dag_id).where(
        ae.c.source_dag_id.is_(None)
    )


def trigger_events(conn: Connection, t: AirflowTables, event_ids: Iterable[int]) -> list[TriggerEvent]:
    """The events among ``event_ids`` that a trigger submitted (asset_event_pkey)."""
    found: list[TriggerEvent] = []
    for part in chunks(sorted(set(event_ids))):
        found += _trigger_events(conn.execute(_trigger_event_select(t).where(t.asset_event.c.id.in_(part))))
    return found


def trigger_events_near(
    conn: Connection, t: AirflowTables, events: Iterable[TriggerEvent], window: timedelta
) -> list[TriggerEvent]:
    """Trigger events of each event's asset within ``window`` of it: one range of
    idx_asset_id_timestamp per event (a new run's trigger events are one or two)."""
    ae, found = t.asset_event, {}
    for event in events:
        near = _trigger_event_select(t).where(
            ae.c.asset_id == event.asset_id,
            ae.c.timestamp.between(event.timestamp - window, event.timestamp + window),
        )
        found.update({e.id: e for e in _trigger_events(conn.execute(near))})
    return list(found.values())


def trigger_events_since(
    conn: Connection,
    t: AirflowTables,
    since: datetime | None,
    window: timedelta | None = None,
    asset_ids: Iterable[int] | None = None,
) -> list[TriggerEvent]:
    """The trigger events since ``since`` that could be a copy (scan): a filter over asset_event (no
    index on source_dag_id; Airflow's idx_asset_id_timestamp leads with the asset). On PostgreSQL only
    the events with another event no task wrote of their asset within ``window`` (lag/lead per asset)
    are read with their extra: parsing every payload was most of the cost
    (benchmarks/trigger_event_cost.py). Copies are within ``window`` of each other, so none is missed.
    ``asset_ids``: only those assets' events (a range of idx_asset_id_timestamp each; the
    trigger_flapping check's id-less copies, benchmarks/trigger_copies_cost.py)."""
    ae = t.asset_event
    only = [] if asset_ids is None else [ae.c.asset_id.in_(sorted(set(asset_ids)))]
    if window is None or conn.dialect.name != "postgresql":  # dupguard's SQLite demo: read them all
        query = _trigger_event_select(t).where(*only)
        if since is not None:
            query = query.where(ae.c.timestamp >= since)
        return _trigger_events(conn.execute(query))
    order = (ae.c.timestamp, ae.c.id)
    near = select(
        ae.c.id,
        ae.c.timestamp,
        func.lag(ae.c.timestamp).over(partition_by=ae.c.asset_id, order_by=order).label("prev"),
        func.lead(ae.c.timestamp).over(partition_by=ae.c.asset_id, order_by=order).label("next"),
    ).where(ae.c.source_dag_id.is_(None), *only)
    if since is not None:
        near = near.where(ae.c.timestamp >= since)
    n = near.subquery()
    span = literal(window, Interval())
    close = select(n.c.id).where(or_(n.c.prev >= n.c.timestamp - span, n.c.next <= n.c.timestamp + span))
    return trigger_events(conn, t, conn.execute(close).scalars())


def runs_consuming(conn: Connection, t: AirflowTables, event_ids: Iterable[int]) -> list[Run]:
    """The asset-triggered runs that consumed any of ``event_ids`` (idx_dagrun_asset_events_event_id)."""
    dr, rev = t.dag_run, t.run_events
    found: dict[int, Run] = {}
    for part in chunks(sorted(set(event_ids))):
        consumers = select(rev.c.dag_run_id).where(rev.c.event_id.in_(part))
        query = _run_select(t).where(dr.c.run_type == ASSET_TRIGGERED, dr.c.id.in_(consumers))
        found.update({r.id: r for r in map(_run, conn.execute(query))})
    return list(found.values())


def runs_for_asset_keys(conn: Connection, t: AirflowTables, keys: Sequence[tuple[str, datetime]]) -> list[Run]:
    dr = t.dag_run
    runs: list[Run] = []
    for part in chunks(keys):
        query = _run_select(t).where(
            dr.c.run_type == ASSET_TRIGGERED, tuple_(dr.c.dag_id, dr.c.run_after).in_(list(part))
        )
        runs.extend(_run(r) for r in conn.execute(query))
    return runs


def runs_for_partition_keys(
    conn: Connection, t: AirflowTables, keys: Sequence[tuple[str, str]], since: datetime | None
) -> list[Run]:
    dr = t.dag_run
    runs: list[Run] = []
    for part in chunks(keys):
        query = _run_select(t).where(
            dr.c.run_type == ASSET_TRIGGERED, tuple_(dr.c.dag_id, dr.c.partition_key).in_(list(part))
        )
        if since is not None:
            query = query.where(dr.c.run_after >= since)
        runs.extend(_run(r) for r in conn.execute(query))
    return runs


# --- what runs consumed and did -------------------------------------------------------------------


def consumed_events(conn: Connection, t: AirflowTables, run_ids: Iterable[int]) -> dict[int, frozenset[int]]:
    """run id -> ids of the asset events it consumed (idx_dagrun_asset_events_dag_run_id)."""
    rev = t.run_events
    found: dict[int, set[int]] = defaultdict(set)
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(select(rev.c.dag_run_id, rev.c.event_id).where(rev.c.dag_run_id.in_(part))):
            found[row.dag_run_id].add(row.event_id)
    return {run_id: frozenset(events) for run_id, events in found.items()}


def event_assets(conn: Connection, t: AirflowTables, event_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """asset event id -> (name, uri) of its asset (asset_event and asset pkeys): what alerts name."""
    ae, asset = t.asset_event, t.asset
    found: dict[int, tuple[str, str]] = {}
    for part in chunks(sorted(set(event_ids))):
        query = select(ae.c.id, asset.c.name, asset.c.uri).select_from(ae.join(asset, asset.c.id == ae.c.asset_id))
        found.update({row.id: (row.name, row.uri) for row in conn.execute(query.where(ae.c.id.in_(part)))})
    return found


def task_progress(conn: Connection, t: AirflowTables, run_ids: Iterable[int], now: datetime) -> dict[int, TaskProgress]:
    """run id -> what its task instances did (ti_dag_run index via the dag_run join), and whether
    the in-scheduler guard made it (its note, dag_run_note pkey)."""
    dr, ti = t.dag_run, t.task_instance
    totals: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    guarded: set[int] = set()
    for part in chunks(sorted(set(run_ids))):
        guarded.update(guarded_runs(conn, t, part))
        query = (
            select(dr.c.id, ti.c.state, ti.c.start_date, ti.c.end_date, ti.c.pid, ti.c.last_heartbeat_at)
            .select_from(ti.join(dr, and_(ti.c.dag_id == dr.c.dag_id, ti.c.run_id == dr.c.run_id)))
            .where(dr.c.id.in_(part))
        )
        for row in conn.execute(query):
            acc = totals[row.id]
            acc[0] += 1
            if ti_started(row.state, row.pid, row.last_heartbeat_at):
                acc[1] += 1
                if row.start_date is not None:
                    acc[3] += max(0.0, ((row.end_date or now) - row.start_date).total_seconds())
            elif row.state == "skipped":
                acc[2] += 1
    return {
        run_id: TaskProgress(
            total=int(a[0]), started=int(a[1]), skipped=int(a[2]), task_seconds=a[3], guarded=run_id in guarded
        )
        for run_id, a in totals.items()
    }


def guarded_runs(conn: Connection, t: AirflowTables, run_ids: Sequence[int]) -> set[int]:
    """Which of these runs carry the in-scheduler guard's note (dag_run_note pkey lookups)."""
    note = t.dag_run_note
    query = select(note.c.dag_run_id).where(
        note.c.dag_run_id.in_(run_ids), note.c.content.startswith(GUARD_NOTE_PREFIX, autoescape=True)
    )
    return set(conn.execute(query).scalars())


def run_notes(conn: Connection, t: AirflowTables, run_ids: Iterable[int]) -> dict[int, str]:
    """run id -> its note (dag_run_note pkey): the evidence of earlier keep decisions that Airflow
    stores (``detector.core.decisions``). Needs SELECT on dag_run_note."""
    note = t.dag_run_note
    found: dict[int, str] = {}
    for part in chunks(sorted(set(run_ids))):
        query = select(note.c.dag_run_id, note.c.content).where(
            note.c.dag_run_id.in_(part), note.c.content.is_not(None)
        )
        found.update({row.dag_run_id: row.content for row in conn.execute(query)})
    return found


def run_by_run_id(conn: Connection, t: AirflowTables, dag_id: str, run_id: str) -> Run | None:
    """One run by its natural key (dag_run_dag_id_run_id_key): a retry re-judges its group from it."""
    dr = t.dag_run
    row = conn.execute(_run_select(t).where(dr.c.dag_id == dag_id, dr.c.run_id == run_id)).first()
    return None if row is None else _run(row)


# --- partitioned assets: asset_partition_dag_run (APDR) and its key log (3.2+) ----------------------


def partition_row(row: Row[Any]) -> PartitionRow:
    return PartitionRow(
        id=row.id,
        dag_id=row.target_dag_id,
        partition_key=row.partition_key,
        created_at=row.created_at,
        created_dag_run_id=row.created_dag_run_id,
    )


def partition_columns(t: AirflowTables) -> tuple[Any, ...]:
    a = t.partition_dag_run
    assert a is not None
    return (a.c.id, a.c.target_dag_id, a.c.partition_key, a.c.created_at, a.c.created_dag_run_id)


def partition_rows_for_runs(conn: Connection, t: AirflowTables, run_ids: Iterable[int]) -> dict[int, PartitionRow]:
    """run id -> the APDR row that made it (``created_dag_run_id``; no index: a scan of APDR)."""
    a = t.partition_dag_run
    if a is None:
        return {}
    found: dict[int, PartitionRow] = {}
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(select(*partition_columns(t)).where(a.c.created_dag_run_id.in_(part))):
            found[row.created_dag_run_id] = partition_row(row)
    return found


def ping(conn: Connection) -> None:
    """The cheapest round trip: readiness, the database-up gauge, the leader's heartbeat."""
    conn.execute(select(literal(1)))


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


# --- remediation: the duplicate's state right before acting ---------------------------------------


@dataclass(frozen=True, slots=True)
class TaskState:
    """One task instance of a run, by its composite key (task_instance_composite_key)."""

    task_id: str
    map_index: int
    state: str | None
    # Set by the Execution API's ti_run when a worker starts the task (QUEUED -> RUNNING, with the
    # worker's pid and a first heartbeat; execution_api/routes/task_instances.py L190-197 in 3.1.2).
    # A write whose own read was stale can overwrite the state but never these: the read-back's proof
    # that a task ran (detector.actions.remediation.readback).
    pid: int | None = None
    last_heartbeat_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class RunState:
    """A run and all of its task instances, as read right before a remediation."""

    id: int
    dag_id: str
    run_id: str
    state: str | None
    tasks: tuple[TaskState, ...]


@dataclass(frozen=True, slots=True)
class KeptRun:
    """The kept run of a remediation as re-read right before the write, with its note."""

    state: RunState
    note: str | None


def run_state(
    conn: Connection, t: AirflowTables, dag_id: str, run_id: str, *, lock: bool = False, share: bool = False
) -> RunState | None:
    """The run ``(dag_id, run_id)`` and its task instances' states, or None when it is gone.

    ``share`` takes ``FOR SHARE`` on the dag_run row alone (the kept run, read in the ``db`` backend's
    write transaction): no writer can change the run until the commit, and its tasks still start.

    ``lock`` takes ``FOR UPDATE`` on the dag_run row and then on its task instances, in key order
    (dag_run_dag_id_run_id_key, then ti_dag_run). The scheduler's own selects use ``SKIP LOCKED``
    and the Execution API's ``ti_run`` locks the TI row before QUEUED -> RUNNING, so while the lock
    is held no task of this run can start: the states read here are the states the writes act on.
    """
    dr, ti = t.dag_run, t.task_instance
    run_query = select(dr.c.id, dr.c.state).where(dr.c.dag_id == dag_id, dr.c.run_id == run_id)
    if lock or share:
        run_query = run_query.with_for_update(read=share and not lock)
    row = conn.execute(run_query).first()
    if row is None:
        return None
    ti_query = (
        select(ti.c.task_id, ti.c.map_index, ti.c.state, ti.c.pid, ti.c.last_heartbeat_at)
        .where(ti.c.dag_id == dag_id, ti.c.run_id == run_id)
        .order_by(ti.c.task_id, ti.c.map_index)
    )
    if lock:
        ti_query = ti_query.with_for_update()
    tasks = tuple(
        TaskState(r.task_id, r.map_index, r.state, r.pid, r.last_heartbeat_at) for r in conn.execute(ti_query)
    )
    return RunState(id=row.id, dag_id=dag_id, run_id=run_id, state=row.state, tasks=tasks)


def run_note(conn: Connection, t: AirflowTables, run_pk: int) -> str | None:
    """The note an operator sees on the run page (dag_run_note pkey), or None."""
    note = t.dag_run_note
    return conn.execute(select(note.c.content).where(note.c.dag_run_id == run_pk)).scalar_one_or_none()


# --- dupguard doctor (detector/app/doctor.py): read once, nothing written ----------------------------

# Each DAG-count query reads Airflow tables the detection does not (and the documented grant does not
# name): ``dag``, the schedule references and the watcher links. Their names per version, from the
# committed ``airflow db migrate`` fixtures: 2.x says dataset, 3.x asset; watchers are asset_trigger
# in 3.0/3.1 and asset_watcher from 3.2; dag.timetable_partitioned exists from 3.2.
SCHEDULE_TABLES = ("dag_schedule_asset_reference", "dag_schedule_dataset_reference")
ALIAS_TABLES = ("dag_schedule_asset_alias_reference", "dag_schedule_dataset_alias_reference")
WATCHER_TABLES = ("asset_watcher", "asset_trigger")


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


def can_create_schema(conn: Connection, schema: str) -> bool:
    """Whether ``dupguard init-db`` (or ``DUPGUARD_LEDGER=on``) can make ``schema`` and its tables:
    CREATE on the database, or, when an admin created the schema beforehand, USAGE and CREATE on it."""
    if conn.dialect.name != "postgresql":
        return False
    if conn.execute(select(func.to_regnamespace(literal(schema)))).scalar() is not None:
        on_schema = [func.has_schema_privilege(literal(schema), literal(p)) for p in ("USAGE", "CREATE")]
        return all(conn.execute(select(*on_schema)).one())
    check = func.has_database_privilege(func.current_database(), literal("CREATE"))
    return bool(conn.execute(select(check)).scalar())


def can_use_schema(conn: Connection, schema: str) -> bool:
    return bool(conn.execute(select(func.has_schema_privilege(literal(schema), literal("USAGE")))).scalar())


_job_heartbeat = table("job", column("job_type"), column("state"), column("latest_heartbeat", UtcDateTime))


def schedulers_alive(conn: Connection, since: datetime) -> int:
    """Scheduler jobs in state running whose heartbeat is newer than ``since`` (Airflow's own health
    check: ``[scheduler] scheduler_health_check_threshold``; index job_type_heart)."""
    job = _job_heartbeat
    query = select(func.count()).where(
        job.c.job_type == "SchedulerJob", job.c.state == "running", job.c.latest_heartbeat > since
    )
    return int(conn.execute(query).scalar_one())


def triggerers_alive(conn: Connection, since: datetime) -> int:
    """Triggerer jobs in state running whose heartbeat is newer than ``since`` (``[triggerer]
    triggerer_health_check_threshold``, 30 s by default; index job_type_heart)."""
    job = _job_heartbeat
    query = select(func.count()).where(
        job.c.job_type == "TriggererJob", job.c.state == "running", job.c.latest_heartbeat > since
    )
    return int(conn.execute(query).scalar_one())


def _refs(name: str) -> Any:
    key = "alias_id" if "alias" in name else ("dataset_id" if "dataset" in name else "asset_id")
    return table(name, column("dag_id"), column(key)), key


def _live_dags(dag_columns: set[str]) -> tuple[Any, list[Any]]:
    """The ``dag`` table and the filter for DAGs that can get runs: not paused, not stale (2.x: active)."""
    dag = table("dag", *[column(c) for c in ("dag_id", "is_paused", "is_stale", "is_active", "timetable_partitioned")])
    where = [dag.c.is_paused.is_(False)]
    where.append(dag.c.is_stale.is_(False) if "is_stale" in dag_columns else dag.c.is_active.is_(True))
    return dag, where


def scheduled_dag_count(conn: Connection, dag_columns: set[str], refs: Sequence[str]) -> int:
    """Live DAGs scheduled on an asset or an asset alias (any of the ``refs`` tables)."""
    dag, where = _live_dags(dag_columns)
    ids = union(*[select(_refs(name)[0].c.dag_id) for name in refs]).subquery()
    return int(conn.execute(select(func.count()).where(*where, dag.c.dag_id.in_(select(ids.c.dag_id)))).scalar_one())


def partitioned_dag_counts(conn: Connection, dag_columns: set[str], ref: str) -> tuple[int, int]:
    """(live partitioned DAGs, those scheduled on 2+ assets): 3.2+, ``dag.timetable_partitioned``."""
    dag, where = _live_dags(dag_columns)
    refs, key = _refs(ref)
    per_dag = select(refs.c.dag_id, func.count(refs.c[key]).label("n")).group_by(refs.c.dag_id).subquery()
    query = (
        select(func.count(), func.count().filter(per_dag.c.n >= 2))
        .select_from(dag.outerjoin(per_dag, per_dag.c.dag_id == dag.c.dag_id))
        .where(*where, dag.c.timetable_partitioned.is_(True))
    )
    row = conn.execute(query).one()
    return int(row[0]), int(row[1])


def watcher_fed_dag_count(conn: Connection, dag_columns: set[str], ref: str, watchers: str) -> int:
    """Live DAGs scheduled on an asset that has a watcher (an event-driven trigger feeding it)."""
    dag, where = _live_dags(dag_columns)
    refs, _ = _refs(ref)
    links = table(watchers, column("asset_id"))
    fed = select(refs.c.dag_id).join(links, links.c.asset_id == refs.c.asset_id)
    return int(conn.execute(select(func.count()).where(*where, dag.c.dag_id.in_(fed))).scalar_one())


def guard_notes_since(conn: Connection, t: AirflowTables, since: datetime) -> int:
    """Runs the in-scheduler guard stopped since ``since`` (its note, GUARD_NOTE_PREFIX)."""
    note = t.dag_run_note
    query = select(func.count()).where(
        note.c.content.startswith(GUARD_NOTE_PREFIX, autoescape=True), note.c.created_at >= since
    )
    return int(conn.execute(query).scalar_one())

"""Detection's reads of dag runs and the trigger events behind them, named for what they fetch.

SQLAlchemy Core over the tables declared in ``detector.metadb.schema``; read-only; no string-built SQL.
Rows become frozen ``detector.core.model`` objects here, at the boundary. The index each query relies
on is named beside it (docs/explanation/airflow-internals.md)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Interval,
    Row,
    Select,
    bindparam,
    func,
    literal,
    null,
    or_,
    select,
    tuple_,
)

from detector.core.model import ASSET_TRIGGERED, Run
from detector.core.trigger_event import IdPaths, TriggerEvent, trigger_event
from detector.metadb.batches import chunks
from detector.metadb.schema import AirflowTables

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


ACTIVE_STATES = ("queued", "running")  # a run that counts against max_active_runs


def top_run_and_queues_statement(t: AirflowTables, queues: bool = True) -> Select[Any]:
    """``max(dag_run.id)`` and a fingerprint of Airflow's asset queues: the daemon's idle probe
    (``detector.metadb.prepared``), so a queue row that appears (an asset race may follow) is seen at rest.

    Columns after the top id, only those a schema has (none on 2.x): the ADRQ row count and newest
    ``created_at`` (a small table: one row per waiting (asset, DAG)); the number of active runs of the
    DAGs with a queue row (``dag_id_state``, once per waiting DAG: a DAG held by max_active_runs gets
    its run when one of these ends); 3.2+ the newest ``asset_partition_dag_run`` id (its primary key;
    its pending rows are not counted: no index on ``created_dag_run_id``)."""
    dr = t.dag_run
    columns: list[Any] = [select(func.max(dr.c.id)).scalar_subquery()]
    if not queues:  # a role that may not read the queues (``prepared.queues_unreadable``): the top id alone
        return select(*columns)
    if t.asset_queue is not None:
        q = t.asset_queue
        columns += [
            select(func.count()).select_from(q).scalar_subquery(),
            select(func.max(q.c.created_at)).scalar_subquery(),
            select(func.count())
            .select_from(dr)
            .where(dr.c.dag_id.in_(select(q.c.target_dag_id)), dr.c.state.in_(ACTIVE_STATES))
            .scalar_subquery(),
        ]
    if t.partition_dag_run is not None:
        columns.append(select(func.max(t.partition_dag_run.c.id)).scalar_subquery())
    return select(*columns)


def top_run_and_queues(conn: Connection, t: AirflowTables, queues: bool = True) -> tuple[int, tuple[Any, ...]]:
    """The highest dag_run id (0 on an empty table) and the queues' fingerprint (``top_run_and_queues_statement``)."""
    row = conn.execute(top_run_and_queues_statement(t, queues)).one()
    return int(row[0] or 0), tuple(row[1:])


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


def _trigger_events(rows: Iterable[Row[Any]], id_paths: IdPaths) -> list[TriggerEvent]:
    found = (trigger_event(r.id, r.asset_id, r.timestamp, r.extra, r.source_dag_id, r.name, id_paths) for r in rows)
    return [e for e in found if e is not None]


def _trigger_event_select(t: AirflowTables, id_paths: IdPaths) -> Select[Any]:
    """Events no task wrote (a trigger's, or the REST API's): only those carry a trigger's extra. With
    ``id_paths`` (``message_id_paths``, named by asset) the asset's name too (asset PK)."""
    ae, name = t.asset_event, t.asset.c.name if id_paths else null()
    query = select(ae.c.id, ae.c.asset_id, ae.c.timestamp, ae.c.extra, ae.c.source_dag_id, name.label("name"))
    if id_paths:
        query = query.select_from(ae.join(t.asset, t.asset.c.id == ae.c.asset_id))
    return query.where(ae.c.source_dag_id.is_(None))


def trigger_events(
    conn: Connection, t: AirflowTables, event_ids: Iterable[int], *, id_paths: IdPaths
) -> list[TriggerEvent]:
    """The events among ``event_ids`` that a trigger submitted (asset_event_pkey)."""
    found: list[TriggerEvent] = []
    for part in chunks(sorted(set(event_ids))):
        found += _trigger_events(conn.execute(_trigger_events_by_id(t, id_paths), {"ids": list(part)}), id_paths)
    return found


@functools.cache
def _trigger_events_by_id(t: AirflowTables, id_paths: IdPaths) -> Select[Any]:
    return _trigger_event_select(t, id_paths).where(t.asset_event.c.id.in_(bindparam("ids", expanding=True)))


def trigger_events_near(
    conn: Connection, t: AirflowTables, events: Iterable[TriggerEvent], window: timedelta, *, id_paths: IdPaths
) -> list[TriggerEvent]:
    """Trigger events of each event's asset within ``window`` of it: one range of
    idx_asset_id_timestamp per event (a new run's trigger events are one or two)."""
    ae, found = t.asset_event, {}
    for event in events:
        near = _trigger_event_select(t, id_paths).where(
            ae.c.asset_id == event.asset_id,
            ae.c.timestamp.between(event.timestamp - window, event.timestamp + window),
        )
        found.update({e.id: e for e in _trigger_events(conn.execute(near), id_paths)})
    return list(found.values())


def trigger_events_since(
    conn: Connection,
    t: AirflowTables,
    since: datetime | None,
    window: timedelta | None = None,
    asset_ids: Iterable[int] | None = None,
    *,
    id_paths: IdPaths,
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
        query = _trigger_event_select(t, id_paths).where(*only)
        if since is not None:
            query = query.where(ae.c.timestamp >= since)
        return _trigger_events(conn.execute(query), id_paths)
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
    return trigger_events(conn, t, conn.execute(close).scalars(), id_paths=id_paths)


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
    """The asset runs of each (dag_id, run_after) key (idx_dag_run_run_after): the scan's groups."""
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
    """The asset runs of each (dag_id, partition_key) key since ``since``: the scan's partitioned groups."""
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


def run_by_run_id(conn: Connection, t: AirflowTables, dag_id: str, run_id: str) -> Run | None:
    """One run by its natural key (dag_run_dag_id_run_id_key): a retry re-judges its group from it."""
    dr = t.dag_run
    row = conn.execute(_run_select(t).where(dr.c.dag_id == dag_id, dr.c.run_id == run_id)).first()
    return None if row is None else _run(row)

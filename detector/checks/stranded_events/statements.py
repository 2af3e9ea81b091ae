"""What the stranded_events check reads, in one snapshot each, and the one row its repair writes back
(``requeue_stranded``). SQLAlchemy Core over ``detector.metadb.schema``'s tables; the index each read
relies on is named beside it (docs/explanation/airflow-internals.md, "Asset events that trigger nothing").
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    func,
    literal,
    or_,
    select,
    true,
)
from sqlalchemy.dialects import postgresql, sqlite

from detector.checks.stranded_events.rule import CandidateEvent, StrandedSet
from detector.checks.stranded_events.rule_late import LateCandidate
from detector.checks.stranded_events.rule_pauses import EVENTS, PauseLog, record
from detector.checks.stranded_events.rule_repair import RepairedRun, RepairState, Requeue, WindowEvent
from detector.core.model import ASSET_TRIGGERED
from detector.metadb.schema import (
    AirflowTables,
    UtcDateTime,
)

# Airflow's ``log`` table, the columns the pause records need (idx_log_event, idx_log_dttm).
LOG = Table(
    "log",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("dttm", UtcDateTime),
    Column("event", String(60)),
    Column("dag_id", String(250)),
    Column("extra", Text),
)

STRANDED_EVENTS_PER_ASSET = 1000  # newer events than that per (DAG, asset) are not read in one check


def _stranded_gate(t: AirflowTables, refs: Any) -> tuple[Any, ...]:
    """The DAGs the stranded reads judge: unpaused, not stale, with an asset-triggered run."""
    dag, any_run = t.dag, t.dag_run.alias("any_run")
    assert dag is not None
    return (
        or_(dag.c.is_paused.is_(None), dag.c.is_paused.is_(False)),
        or_(dag.c.is_stale.is_(None), dag.c.is_stale.is_(False)),
        select(literal(1))
        .where(any_run.c.dag_id == refs.c.dag_id, any_run.c.run_type == ASSET_TRIGGERED)
        .correlate(refs)
        .exists(),
    )


def _latest_consuming_run(t: AirflowTables, refs: Any, gate: tuple[Any, ...]) -> Any:
    """Per (DAG, asset): the asset-triggered run of the DAG that consumed the asset's newest consumed
    event (a stranded event is newer than every event its DAG consumed; a late one is in its window).
    Walking the asset's events newest first (idx_asset_id_timestamp) stops at the first consumed one;
    ordering the DAG's runs by run_after instead made PostgreSQL walk idx_dag_run_run_after backwards
    through every run of every DAG for a DAG that never ran (30 s at 10M events)."""
    dr, e, x = t.dag_run, t.asset_event, t.run_events
    partitioned = "partition_key" in dr.c
    seen, consumed_by = e.alias("consumed_event"), x.alias("consumed_link")
    return (
        select(
            dr.c.id,
            dr.c.run_id,
            dr.c.run_after,
            dr.c.queued_at,
            dr.c.clear_number,
            (dr.c.created_at if partitioned else literal(None, UtcDateTime)).label("created_at"),
        )
        .select_from(
            seen.join(consumed_by, consumed_by.c.event_id == seen.c.id).join(dr, dr.c.id == consumed_by.c.dag_run_id)
        )
        .where(seen.c.asset_id == refs.c.asset_id, dr.c.dag_id == refs.c.dag_id, dr.c.run_type == ASSET_TRIGGERED)
        .where(*gate)
        .where(*([dr.c.partition_key.is_(None)] if partitioned else []))
        .order_by(seen.c.timestamp.desc(), seen.c.id.desc(), dr.c.run_after.desc(), dr.c.id.desc())
        .limit(1)
    )


def _asset_label(name: str, uri: str) -> str:
    """How an alert names an asset: its name, and its URI when that differs."""
    return name if name == uri else f"{name} ({uri})"


def stranded_event_candidates(conn: Connection, t: AirflowTables, since: datetime | None) -> list[CandidateEvent]:
    """Per (DAG, asset) reference: the events newer than the run that consumed the asset's newest
    consumed event (a stranded event is newer than every event its DAG consumed), for DAGs unpaused,
    not stale, with no queue row and with an asset-triggered run.

    One statement, so the events, their consumption, the queue and the runs are one snapshot (a run
    committed between two reads would look like a run created after an event it did consume). The
    prefilters keep the result to what ``detector.checks.stranded_events.rule`` judges (it checks them again):
    idx_asset_id_timestamp serves the event range, idx_dagrun_asset_events_event_id the consumption.
    """
    q, refs, alias, dag = t.asset_queue, t.schedule_refs, t.alias_events, t.dag
    if q is None or refs is None or alias is None or dag is None:
        return []
    dr, e, a, x = t.dag_run, t.asset_event, t.asset, t.run_events
    consumer = dr.alias("consumer_run")
    floor = refs.alias("floor_ref")
    partitioned = "partition_key" in dr.c
    # Outer-only conditions inside the LATERAL are a one-time filter before its scan: the walk
    # never starts for a DAG with a queue row, paused, stale, or without any asset-triggered run.
    gate = (
        *_stranded_gate(t, refs),
        ~select(literal(1)).where(q.c.target_dag_id == refs.c.dag_id).correlate(refs).exists(),
    )
    latest_query = _latest_consuming_run(t, refs, gate)
    event_cols = [e.c.id, e.c.asset_id, e.c.timestamp, *([e.c.partition_key] if partitioned else [])]
    latest: Any
    ev: Any = e
    if conn.dialect.name == "sqlite":  # no LATERAL there; a dev database is small
        latest = dr.alias("latest_run")
        latest_on = latest.c.id == latest_query.with_only_columns(dr.c.id).scalar_subquery()
        created = latest.c.created_at if partitioned else literal(None, UtcDateTime)
    else:
        # LATERAL: with the correlated id subquery in the join condition PostgreSQL hashed every
        # dag_run row to join them (benchmarks/stranded_check_cost.py).
        latest, latest_on = latest_query.lateral("latest_run"), true()
        created = latest.c.created_at
        # JIT compiling this plan took seconds (PostgreSQL guesses a third of an asset's events are
        # newer than a run_after it cannot know); for this transaction only.
        conn.execute(select(func.set_config("jit", "off", True)))
        # The events as LATERAL with a LIMIT (which keeps PostgreSQL from flattening it): otherwise its
        # index scan took only asset_id as its condition and filtered every event of the asset on
        # run_after (8 s at 1M events). A cap per (DAG, asset) bounds a huge backlog too.
        ev = (
            select(*event_cols)
            .where(e.c.asset_id == refs.c.asset_id, e.c.timestamp > latest.c.run_after)
            .order_by(e.c.timestamp, e.c.id)
            .limit(STRANDED_EVENTS_PER_ASSET)
            .lateral("new_event")
        )
    consumed = (
        select(literal(1))
        .select_from(x.join(consumer, consumer.c.id == x.c.dag_run_id))
        .where(x.c.event_id == ev.c.id, consumer.c.dag_id == refs.c.dag_id)
        .exists()
    )
    query = (
        select(
            refs.c.dag_id,
            ev.c.id.label("event_id"),
            a.c.name,
            a.c.uri,
            ev.c.timestamp,
            consumed.label("consumed"),
            select(literal(1)).where(alias.c.event_id == ev.c.id).exists().label("via_alias"),
            (ev.c.partition_key if partitioned else literal(None, String)).label("partition_key"),
            dag.c.is_paused,
            select(func.count()).where(q.c.target_dag_id == refs.c.dag_id).scalar_subquery().label("queue_rows"),
            select(func.min(floor.c.created_at))
            .where(floor.c.dag_id == refs.c.dag_id)
            .scalar_subquery()
            .label("floor"),
            latest.c.run_id,
            latest.c.run_after,
            created.label("run_created_at"),
            latest.c.queued_at,
            latest.c.clear_number,
        )
        .select_from(
            refs.join(dag, dag.c.dag_id == refs.c.dag_id)
            .join(latest, latest_on)
            .join(ev, and_(ev.c.asset_id == refs.c.asset_id, ev.c.timestamp > latest.c.run_after))
            .join(a, a.c.id == ev.c.asset_id)
        )
        .where(*gate)
        .order_by(refs.c.dag_id, ev.c.timestamp, ev.c.id)
    )
    if partitioned:
        query = query.where(ev.c.partition_key.is_(None))
    if since is not None:
        query = query.where(ev.c.timestamp >= since)
    return [
        CandidateEvent(
            dag_id=r.dag_id,
            event_id=r.event_id,
            asset=_asset_label(r.name, r.uri),
            timestamp=r.timestamp,
            consumed=bool(r.consumed),
            via_alias=bool(r.via_alias),
            partition_key=r.partition_key,
            dag_paused=bool(r.is_paused),
            queue_rows=int(r.queue_rows),
            schedule_floor=r.floor,
            run_id=r.run_id,
            run_after=r.run_after,
            run_created_at=r.run_created_at,
            run_queued_at=r.queued_at,
            run_clear_number=int(r.clear_number or 0),
        )
        for r in conn.execute(query)
    ]


def stranded_late_candidates(conn: Connection, t: AirflowTables, since: datetime | None) -> list[LateCandidate]:
    """Per (DAG, asset) reference of a DAG the stranded reads judge (``_stranded_gate``; a queue row
    does not exclude it): the events consumed by no run of the DAG between the asset's newest event
    consumed by an earlier asset run of the DAG and the run_after of the run that consumed its newest
    consumed event (``detector.checks.stranded_events.rule_late``). One statement, one snapshot.

    Both walks go down idx_asset_id_timestamp from that run_after and probe
    idx_dagrun_asset_events_event_id: they read the latest run's window, not the asset's history. On
    SQLite (a dev database, no LATERAL) nothing is read.
    """
    q, refs, alias, dag = t.asset_queue, t.schedule_refs, t.alias_events, t.dag
    if q is None or refs is None or alias is None or dag is None or conn.dialect.name == "sqlite":
        return []
    dr, e, a, x = t.dag_run, t.asset_event, t.asset, t.run_events
    partitioned = "partition_key" in dr.c
    gate = _stranded_gate(t, refs)
    latest = _latest_consuming_run(t, refs, gate).lateral("latest_run")
    bound_event, bound_link, earlier = e.alias("bound_event"), x.alias("bound_link"), dr.alias("earlier_run")
    # The window's lower end: an event consumed by an earlier run of the DAG is at or before that run's
    # run_after, so every event after it and up to the latest run's run_after is in a kept run's window.
    bound = (
        select(bound_event.c.timestamp)
        .select_from(
            bound_event.join(bound_link, bound_link.c.event_id == bound_event.c.id).join(
                earlier, earlier.c.id == bound_link.c.dag_run_id
            )
        )
        .where(
            bound_event.c.asset_id == refs.c.asset_id,
            bound_event.c.timestamp <= latest.c.run_after,
            earlier.c.dag_id == refs.c.dag_id,
            earlier.c.run_type == ASSET_TRIGGERED,
            earlier.c.id != latest.c.id,
        )
        .order_by(bound_event.c.timestamp.desc(), bound_event.c.id.desc())
        .limit(1)
        .lateral("window_from")
    )
    consumer = dr.alias("consumer_run")
    consumed = (
        select(literal(1))
        .select_from(x.join(consumer, consumer.c.id == x.c.dag_run_id))
        .where(x.c.event_id == e.c.id, consumer.c.dag_id == refs.c.dag_id)
        .correlate_except(x, consumer)  # two levels down: the events of the LATERAL and the outer refs
        .exists()
    )
    conn.execute(select(func.set_config("jit", "off", True)))  # as in stranded_event_candidates
    ev = (
        select(e.c.id, e.c.asset_id, e.c.timestamp, *([e.c.partition_key] if partitioned else []))
        .where(
            e.c.asset_id == refs.c.asset_id,
            e.c.timestamp > bound.c.timestamp,
            e.c.timestamp <= latest.c.run_after,
            ~consumed,
        )
        .order_by(e.c.timestamp, e.c.id)
        .limit(STRANDED_EVENTS_PER_ASSET)
        .lateral("late_event")
    )
    query = (
        select(
            refs.c.dag_id,
            ev.c.id.label("event_id"),
            a.c.name,
            a.c.uri,
            ev.c.timestamp,
            select(literal(1)).where(alias.c.event_id == ev.c.id).exists().label("via_alias"),
            (ev.c.partition_key if partitioned else literal(None, String)).label("partition_key"),
            refs.c.created_at.label("schedule_since"),
            latest.c.run_id,
            latest.c.run_after,
            bound.c.timestamp.label("window_from"),
            select(func.max(q.c.created_at))
            .where(q.c.target_dag_id == refs.c.dag_id)
            .scalar_subquery()
            .label("queue_newest"),
        )
        .select_from(
            refs.join(dag, dag.c.dag_id == refs.c.dag_id)
            .join(latest, true())
            .join(bound, true())
            .join(ev, true())
            .join(a, a.c.id == ev.c.asset_id)
        )
        .where(*gate)
        .order_by(refs.c.dag_id, ev.c.timestamp, ev.c.id)
    )
    if since is not None:
        query = query.where(ev.c.timestamp >= since)
    return [
        LateCandidate(
            dag_id=r.dag_id,
            event_id=r.event_id,
            asset=_asset_label(r.name, r.uri),
            timestamp=r.timestamp,
            via_alias=bool(r.via_alias),
            partition_key=r.partition_key,
            schedule_since=r.schedule_since,
            run_id=r.run_id,
            run_after=r.run_after,
            window_from=r.window_from,
            queue_newest=r.queue_newest,
        )
        for r in conn.execute(query)
    ]


def stranded_repair_state(conn: Connection, t: AirflowTables, s: StrandedSet, requeue_at: datetime) -> RepairState:
    """The DAG of ``s`` as Airflow's scheduler would read it for a queue row created at ``requeue_at``
    (``detector.checks.stranded_events.rule_repair``): its schedule, queue rows, the run below that bounds the window,
    runs at or after it, the window's events and which of the set's events a run consumed. In the
    repair's writing transaction (READ COMMITTED) each statement sees what was committed before it."""
    q, refs, dag = t.asset_queue, t.schedule_refs, t.dag
    assert q is not None and refs is not None and dag is not None  # the check applies to Airflow 3 only
    dr, e, x = t.dag_run, t.asset_event, t.run_events
    partitioned = dag.c.timetable_partitioned if "timetable_partitioned" in dag.c else literal(False)
    head = conn.execute(
        select(dag.c.is_paused, dag.c.asset_expression, partitioned.label("partitioned")).where(
            dag.c.dag_id == s.dag_id
        )
    ).one()
    assets = tuple(conn.scalars(select(refs.c.asset_id).where(refs.c.dag_id == s.dag_id).order_by(refs.c.asset_id)))
    rows = conn.scalar(select(func.count()).select_from(q).where(q.c.target_dag_id == s.dag_id)) or 0
    asset_runs = and_(dr.c.dag_id == s.dag_id, dr.c.run_type == ASSET_TRIGGERED)
    previous = conn.scalar(select(func.max(dr.c.run_after)).where(asset_runs, dr.c.run_after < requeue_at))
    later = tuple(conn.scalars(select(dr.c.run_id).where(asset_runs, dr.c.run_after >= requeue_at).order_by(dr.c.id)))
    consumed_by_dag = (
        select(literal(1))
        .select_from(x.join(dr, dr.c.id == x.c.dag_run_id))
        .where(x.c.event_id == e.c.id, dr.c.dag_id == s.dag_id)
        .exists()
    )
    # The scheduler's event SELECT (3.0.6 L1650 … 3.3.2 L2638) for a DAG on assets only (aliases are refused).
    window = []
    if previous is not None:
        window = [
            WindowEvent(event_id=r.id, asset_id=r.asset_id, consumed=bool(r.consumed))
            for r in conn.execute(
                select(e.c.id, e.c.asset_id, consumed_by_dag.label("consumed"))
                .where(e.c.asset_id.in_(assets), e.c.timestamp > previous, e.c.timestamp <= requeue_at)
                .order_by(e.c.timestamp, e.c.id)
            )
        ]
    consumed = tuple(conn.scalars(select(e.c.id).where(e.c.id.in_(s.event_ids), consumed_by_dag).order_by(e.c.id)))
    return RepairState(
        dag_id=s.dag_id,
        paused=bool(head.is_paused),
        partitioned=bool(head.partitioned),
        expression=head.asset_expression,
        scheduled_assets=assets,
        queue_rows=int(rows),
        previous_run_after=previous,
        later_runs=later,
        window=tuple(window),
        consumed=consumed,
    )


def requeue_stranded(conn: Connection, t: AirflowTables, plan: Requeue) -> int:
    """The repair's write: the queue rows Airflow's own ``ON CONFLICT DO NOTHING`` insert would have
    left (airflow/assets/manager.py), with ``created_at`` = the plan's T; never over a row the scheduler
    or a new event wrote (it wins). Returns how many rows were written."""
    q = t.asset_queue
    assert q is not None
    rows = [{"asset_id": a, "target_dag_id": plan.dag_id, "created_at": plan.created_at} for a in plan.asset_ids]
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    result = conn.execute(insert(q).values(rows).on_conflict_do_nothing())
    return int(result.rowcount or 0)


def asset_runs_at(conn: Connection, t: AirflowTables, dag_id: str, run_after: datetime) -> list[RepairedRun]:
    """The DAG's asset-triggered runs with this ``run_after`` and the events each consumed (the
    repair's follow-up)."""
    dr, x = t.dag_run, t.run_events
    found: dict[str, list[int]] = defaultdict(list)
    for r in conn.execute(
        select(dr.c.run_id, x.c.event_id)
        .select_from(dr.outerjoin(x, x.c.dag_run_id == dr.c.id))
        .where(dr.c.dag_id == dag_id, dr.c.run_type == ASSET_TRIGGERED, dr.c.run_after == run_after)
        .order_by(dr.c.id, x.c.event_id)
    ):
        found[r.run_id] += [r.event_id] if r.event_id is not None else []
    return [RepairedRun(run_id=k, event_ids=tuple(v)) for k, v in found.items()]


def pause_log(conn: Connection, t: AirflowTables, dag_ids: set[str], *, patch_direction: bool) -> PauseLog:
    """The pause and unpause records of ``dag_ids`` and every bulk one (``rule_pauses``), and the log's oldest
    row. Pauses are rare: idx_log_event reads a few rows; the oldest row is one step of idx_log_dttm."""
    dag = t.dag
    assert dag is not None
    names_dag = select(literal(1)).where(dag.c.dag_id == LOG.c.dag_id).exists()
    rows = conn.execute(
        select(LOG.c.event, LOG.c.dag_id, LOG.c.dttm, LOG.c.extra, names_dag.label("names_dag"))
        .where(LOG.c.event.in_(EVENTS), LOG.c.dttm.is_not(None))
        .where(or_(LOG.c.dag_id.in_(sorted(dag_ids)), LOG.c.dag_id.is_(None), ~names_dag))
        .order_by(LOG.c.dttm, LOG.c.id)
    )
    records = tuple(
        record(r.event, r.dag_id, r.dttm, r.extra, names_dag=bool(r.names_dag), patch_direction=patch_direction)
        for r in rows
    )
    return PauseLog(records, conn.scalar(select(func.min(LOG.c.dttm))))

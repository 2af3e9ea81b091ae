"""Detection's sibling question: which asset-triggered runs could share a new run's trigger, one
statement per poll's batch (``siblings_of_runs``). SQLAlchemy Core over ``detector.metadb.schema``;
read-only. The index each arm relies on is named beside it (docs/explanation/airflow-internals.md)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import CompoundSelect, Connection, Integer, and_, bindparam, cast, null, union
from sqlalchemy.sql.selectable import NamedFromClause
from sqlalchemy.types import TypeEngine

from detector.core.model import ASSET_TRIGGERED, Run
from detector.metadb.batches import chunks, keys_params, keys_table
from detector.metadb.dag_runs import _run, _run_select  # the columns every read of runs shares
from detector.metadb.schema import AirflowTables

SIBLINGS_PER_STATEMENT = 1000  # runs asking in one statement: a poll's batch
SAME_PARTITION = "same_partition"  # the asked partition keys, as a table


def sibling_runs(
    conn: Connection, t: AirflowTables, run: Run, event_ids: Iterable[int], window: timedelta
) -> list[Run]:
    """``siblings_of_runs`` of one run (benchmarks/poll_cost.py measures its statement)."""
    return siblings_of_runs(conn, t, [run], {run.id: event_ids}, window)[run.id]


def siblings_of_runs(
    conn: Connection,
    t: AirflowTables,
    runs: Sequence[Run],
    events: Mapping[int, Iterable[int]],
    window: timedelta,
    per_statement: int = SIBLINGS_PER_STATEMENT,
) -> dict[int, list[Run]]:
    """Asset-triggered runs of each run's DAG that could share its trigger (run id -> its siblings).

    One UNION arm per way of being a sibling, so each is answered from an index: the same run_after
    (idx_dag_run_run_after), a shared consumed event (dagrun_asset_event.event_id -> dag_run_pkey),
    and, for partitioned runs, the same partition key within ``window`` (run_after range). An OR of
    the three made PostgreSQL read every run of the DAG: 55 ms at 10M rows instead of 0.5 ms
    (benchmarks/poll_cost.py, benchmarks/results/measurements.md). The asked keys are data, not SQL
    text: each arm joins the askers' keys (``batches.keys_table``: arrays unnested on PostgreSQL) to
    dag_run, so ``per_statement`` runs ask in one statement of a fixed shape, compiled once, its plan a
    join on the same indexes. A UNION of two or three arms per run, built and compiled anew for every
    batch, was most of a storm's detection (benchmarks/results/storm-detection-profile-5ffee71.txt).
    Runs whose question is the same (the DAG, run_after, partition key and events: a storm's pair,
    both new in one poll) ask once, and each gets the answer."""
    found: dict[int, list[Run]] = {r.id: [] for r in runs}
    same: dict[tuple[Any, ...], list[Run]] = {}
    for run in runs:
        key = (run.dag_id, run.run_after, run.partition_key, tuple(sorted(set(events.get(run.id, ())))))
        same.setdefault(key, []).append(run)
    askers = {group[0].id: [r.id for r in group] for group in same.values()}
    asking = [group[0] for group in same.values()]
    for part in chunks(asking, per_statement):
        # The runs of a shared run_after or event come once, each row for the askers of its DAG and key.
        by_key: dict[tuple[str, Any], list[int]] = {}
        for run in part:
            by_key.setdefault((run.dag_id, run.run_after), []).append(run.id)
            for event_id in set(events.get(run.id, ())):
                by_key.setdefault((run.dag_id, event_id), []).append(run.id)
        for row in conn.execute(*_siblings_statement(t, part, events, window, conn.dialect.name)):
            sibling, m = _run(row), row._mapping
            if m["asked_for"] is not None:
                asked = [m["asked_for"]]
            else:
                via = sibling.run_after if m["via_event"] is None else m["via_event"]
                asked = by_key.get((sibling.dag_id, via), [])
            for run_id in (r for a in asked for r in askers[a]):
                if all(s.id != sibling.id for s in found[run_id]):
                    found[run_id].append(sibling)
    return found


def _siblings_statement(
    t: AirflowTables,
    runs: Sequence[Run],
    events: Mapping[int, Iterable[int]],
    window: timedelta,
    dialect: str,
) -> tuple[CompoundSelect[Any], dict[str, Any]]:
    """The UNION of the sibling arms of ``runs`` and its parameters: the runs of their DAGs with one of
    their run_afters or events (matched to their askers by the caller), and those of a partition key
    near theirs. Every asked key is a parameter: on PostgreSQL the statement is built once per shape
    (``_siblings_shape``); building it and its cache key for every poll cost a duplicate pair more than
    the statement's own round trip. SQLite writes the partition keys' VALUES list into it."""
    consumed = sorted({e for r in runs for e in events.get(r.id, ())})
    params: dict[str, Any] = {
        "sibling_dags": sorted({r.dag_id for r in runs}),
        "sibling_afters": sorted({r.run_after for r in runs}),
    }
    if consumed:
        params["sibling_events"] = consumed
    partitioned = [r for r in runs if r.partition_key is not None] if t.family.has_partitions else []
    keys = [(r.id, r.dag_id, r.partition_key, r.run_after - window, r.run_after + window) for r in partitioned]
    if dialect == "postgresql":
        if keys:
            params |= keys_params(SAME_PARTITION, _partition_columns(t), keys)
        return _siblings_shape(t, bool(consumed), bool(keys)), params
    near = keys_table(dialect, SAME_PARTITION, _partition_columns(t), keys) if keys else None
    return _siblings_union(t, bool(consumed), near), params


def _partition_columns(t: AirflowTables) -> list[tuple[str, TypeEngine[Any]]]:
    dr = t.dag_run
    after = dr.c.run_after.type
    return [
        ("asked_for", Integer()),
        ("asked_dag", dr.c.dag_id.type),
        ("asked_key", dr.c.partition_key.type),
        ("asked_from", after),
        ("asked_to", after),
    ]


@functools.cache
def _siblings_shape(t: AirflowTables, with_events: bool, with_partitions: bool) -> CompoundSelect[Any]:
    """The PostgreSQL sibling UNION of one shape, its asked keys left to the execution's parameters."""
    near = keys_table("postgresql", SAME_PARTITION, _partition_columns(t), None) if with_partitions else None
    return _siblings_union(t, with_events, near)


def _siblings_union(t: AirflowTables, with_events: bool, near: NamedFromClause | None) -> CompoundSelect[Any]:
    dr, rev = t.dag_run, t.run_events
    # Each key's runs read once: joined to every asker, a storm's thousands of runs of one run_after (or
    # consumers of one event) were read once per asker (quadratic); rows go to askers by (DAG, key).
    dags = bindparam("sibling_dags", expanding=True, type_=dr.c.dag_id.type)
    no_asker, no_event = cast(null(), Integer).label("asked_for"), cast(null(), Integer).label("via_event")
    arms = [
        _run_select(t)
        .add_columns(no_asker, no_event)
        .where(
            dr.c.run_type == ASSET_TRIGGERED,
            dr.c.run_after.in_(bindparam("sibling_afters", expanding=True, type_=dr.c.run_after.type)),
            dr.c.dag_id.in_(dags),
        )
    ]
    if with_events:
        arms.append(
            _run_select(t)
            .add_columns(no_asker, rev.c.event_id.label("via_event"))
            .join(rev, rev.c.dag_run_id == dr.c.id)
            .where(
                dr.c.run_type == ASSET_TRIGGERED,
                rev.c.event_id.in_(bindparam("sibling_events", expanding=True)),
                dr.c.dag_id.in_(dags),
            )
        )
    if near is not None:
        arms.append(
            _run_select(t)
            .add_columns(near.c.asked_for, no_event)
            .join(
                near,
                and_(
                    dr.c.dag_id == near.c.asked_dag,
                    dr.c.partition_key == near.c.asked_key,
                    dr.c.run_after.between(near.c.asked_from, near.c.asked_to),
                ),
            )
            .where(dr.c.run_type == ASSET_TRIGGERED)
        )
    return union(*arms)


def warm(conn: Connection, t: AirflowTables) -> None:
    """The sibling statement of every shape sent once with nothing to ask (it finds nothing) when a leader
    term starts, so that a term's first duplicate does not pay its compilation. Not on SQLite, where the
    statement is built for each batch (its partition keys are a VALUES list)."""
    if conn.dialect.name != "postgresql":
        return
    for with_events in (False, True):
        for with_partitions in (False, True) if t.family.has_partitions else (False,):
            params: dict[str, Any] = {"sibling_dags": [], "sibling_afters": []}
            if with_events:
                params["sibling_events"] = []
            if with_partitions:
                params |= keys_params(SAME_PARTITION, _partition_columns(t), [])
            conn.execute(_siblings_shape(t, with_events, with_partitions), params)

"""What runs consumed and did: their asset events, task progress, notes (detection and the scan)."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Select,
    and_,
    bindparam,
    case,
    select,
)

from detector.core.model import GUARD_NOTE_PREFIX, TaskProgress, ti_started
from detector.core.trigger_event import IdPaths, TriggerEvent, trigger_event
from detector.metadb.batches import chunks
from detector.metadb.schema import AirflowTables

# --- what runs consumed and did -------------------------------------------------------------------


# The statements of the detection path are built once each (building one and its cache key at every poll
# cost about as much as sending it); their ids are one expanding parameter, ``ids``.


@functools.cache
def _consumed_statement(t: AirflowTables) -> Select[Any]:
    rev = t.run_events
    return select(rev.c.dag_run_id, rev.c.event_id).where(rev.c.dag_run_id.in_(bindparam("ids", expanding=True)))


def consumed_events(conn: Connection, t: AirflowTables, run_ids: Iterable[int]) -> dict[int, frozenset[int]]:
    """run id -> ids of the asset events it consumed (idx_dagrun_asset_events_dag_run_id)."""
    found: dict[int, set[int]] = defaultdict(set)
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(_consumed_statement(t), {"ids": list(part)}):
            found[row.dag_run_id].add(row.event_id)
    return {run_id: frozenset(events) for run_id, events in found.items()}


@dataclass(frozen=True)
class Consumed:
    """What new runs consumed, read in one statement: the events of each run, the asset of each event
    (what alerts name) and, among those events, the ones a trigger submitted (``trigger_event`` kind)."""

    events: dict[int, frozenset[int]]  # run id -> ids of the asset events it consumed
    assets: dict[int, tuple[str, str]]  # event id -> (name, uri) of its asset
    triggers: list[TriggerEvent]


def consumed_with_assets(conn: Connection, t: AirflowTables, run_ids: Iterable[int], id_paths: IdPaths) -> Consumed:
    """``consumed_events``, ``event_assets`` and ``dag_runs.trigger_events`` of the same runs in one
    statement (idx_dagrun_asset_events_dag_run_id, then asset_event and asset by primary key): on a new
    duplicate's path to its alert they were three round trips in a row. Only an event no task wrote
    (``source_dag_id`` NULL) is read with its extra, as ``dag_runs.trigger_events`` reads it."""
    found: dict[int, set[int]] = defaultdict(set)
    assets: dict[int, tuple[str, str]] = {}
    triggers: dict[int, TriggerEvent] = {}
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(_consumed_with_assets_statement(t), {"ids": list(part)}):
            found[row.dag_run_id].add(row.event_id)
            if row.name is not None:
                assets[row.event_id] = (row.name, row.uri)
            if row.asset_id is not None and row.event_id not in triggers:
                event = trigger_event(
                    row.event_id, row.asset_id, row.timestamp, row.extra, row.source_dag_id, row.name, id_paths
                )
                if event is not None:
                    triggers[row.event_id] = event
    events = {run_id: frozenset(ids) for run_id, ids in found.items()}
    return Consumed(events, assets, list(triggers.values()))


@functools.cache
def _consumed_with_assets_statement(t: AirflowTables) -> Select[Any]:
    rev, ae, asset = t.run_events, t.asset_event, t.asset
    # Outer joins: the consumed event ids are the link table's own, whatever the event and asset rows hold.
    extra = case((ae.c.source_dag_id.is_(None), ae.c.extra)).label("extra")
    return (
        select(rev.c.dag_run_id, rev.c.event_id, ae.c.asset_id, ae.c.timestamp, extra, ae.c.source_dag_id)
        .add_columns(asset.c.name, asset.c.uri)
        .select_from(rev.outerjoin(ae, ae.c.id == rev.c.event_id).outerjoin(asset, asset.c.id == ae.c.asset_id))
        .where(rev.c.dag_run_id.in_(bindparam("ids", expanding=True)))
    )


def event_assets(conn: Connection, t: AirflowTables, event_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """asset event id -> (name, uri) of its asset (asset_event and asset pkeys): what alerts name."""
    found: dict[int, tuple[str, str]] = {}
    for part in chunks(sorted(set(event_ids))):
        found.update({row.id: (row.name, row.uri) for row in conn.execute(_assets_statement(t), {"ids": list(part)})})
    return found


@functools.cache
def _assets_statement(t: AirflowTables) -> Select[Any]:
    ae, asset = t.asset_event, t.asset
    query = select(ae.c.id, asset.c.name, asset.c.uri).select_from(ae.join(asset, asset.c.id == ae.c.asset_id))
    return query.where(ae.c.id.in_(bindparam("ids", expanding=True)))


def warm(conn: Connection, t: AirflowTables) -> None:
    """The judging's statements of this module sent once each with no ids (they find nothing) when a
    leader term starts: the first duplicate of a term no longer pays their compilation."""
    for statement in (
        _consumed_statement(t),
        _consumed_with_assets_statement(t),
        _assets_statement(t),
        _progress_statement(t),
    ):
        conn.execute(statement, {"ids": []})


def progress_and_notes(
    conn: Connection, t: AirflowTables, run_ids: Iterable[int], now: datetime
) -> tuple[dict[int, TaskProgress], dict[int, str]]:
    """run id -> what its task instances did (ti_dag_run index via the dag_run join), with whether the
    in-scheduler guard made it; and run id -> its note (dag_run_note pkey): the evidence of earlier keep
    decisions that Airflow stores (``detector.core.decisions``). One statement per chunk: the notes
    were two more round trips on every duplicate's path to its alert. Needs SELECT on dag_run_note."""
    totals: dict[int, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0])
    notes: dict[int, str] = {}
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(_progress_statement(t), {"ids": list(part)}):
            if row.content is not None:
                notes[row.id] = row.content
            if row.task_id is None:  # no task instance (yet): a note alone
                continue
            acc = totals[row.id]
            acc[0] += 1
            if ti_started(row.state, row.pid, row.last_heartbeat_at):
                acc[1] += 1
                if row.start_date is not None:
                    acc[3] += max(0.0, ((row.end_date or now) - row.start_date).total_seconds())
            elif row.state == "skipped":
                acc[2] += 1
    progress = {
        run_id: TaskProgress(
            total=int(a[0]),
            started=int(a[1]),
            skipped=int(a[2]),
            task_seconds=a[3],
            guarded=notes.get(run_id, "").startswith(GUARD_NOTE_PREFIX),
        )
        for run_id, a in totals.items()
    }
    return progress, notes


@functools.cache
def _progress_statement(t: AirflowTables) -> Select[Any]:
    dr, ti, note = t.dag_run, t.task_instance, t.dag_run_note
    return (
        select(dr.c.id, note.c.content, ti.c.task_id, ti.c.state)
        .add_columns(ti.c.start_date, ti.c.end_date, ti.c.pid, ti.c.last_heartbeat_at)
        .select_from(
            dr.outerjoin(note, note.c.dag_run_id == dr.c.id).outerjoin(
                ti, and_(ti.c.dag_id == dr.c.dag_id, ti.c.run_id == dr.c.run_id)
            )
        )
        .where(dr.c.id.in_(bindparam("ids", expanding=True)))
    )

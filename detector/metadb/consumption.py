"""What runs consumed and did: their asset events, task progress, notes (detection and the scan)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import (
    Connection,
    and_,
    select,
)

from detector.core.model import GUARD_NOTE_PREFIX, TaskProgress, ti_started
from detector.metadb.batches import chunks
from detector.metadb.schema import AirflowTables

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

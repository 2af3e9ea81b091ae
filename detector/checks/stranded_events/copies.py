"""A trigger's copies among the stranded events: the same reads the database source makes for the
``trigger_event`` kind (``detector.sources.database.copies``), asked of the sets' events. A copy of a
message a run of the DAG consumed is marked: its repair would run the consumer again for it.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import Connection

from detector.checks.stranded_events.rule import StrandedSet, with_copies
from detector.core.trigger_event import IdPaths, copies
from detector.metadb import consumption, dag_runs
from detector.metadb.schema import AirflowTables
from detector.sources.database.copies import consumers


def of_stranded(
    conn: Connection, t: AirflowTables, sets: list[StrandedSet], window: timedelta, id_paths: IdPaths
) -> list[StrandedSet]:
    """``sets`` with their events that copy a message a run of their DAG consumed marked
    (``stranded.with_copies``); no read beyond the events' own rows when none is a trigger's."""
    mine = dag_runs.trigger_events(conn, t, {e for s in sets for e in s.event_ids}, id_paths=id_paths)
    if not mine:
        return sets
    ids = {e.id for e in mine}
    near = dag_runs.trigger_events_near(conn, t, mine, window, id_paths=id_paths)
    found = [c for c in copies(near, window) if c.event_ids & ids]
    runs = {r.id: r for r in consumers(conn, t, found, {s.dag_id for s in sets})}
    consumed = consumption.consumed_events(conn, t, runs)
    marked = []
    for s in sets:
        by_event: dict[int, list[str]] = {}
        for run_pk, events in consumed.items():
            if runs[run_pk].dag_id == s.dag_id:
                for event_id in events:
                    by_event.setdefault(event_id, []).append(runs[run_pk].run_id)
        marked.append(with_copies(s, found, by_event))
    return marked

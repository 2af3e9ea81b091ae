"""The trigger events the database source judges for the ``trigger_event`` kind (detector.core.trigger_event).

Cheap on the poll: a new asset run's consumed events are looked up by primary key, and only those
no task wrote (``source_dag_id`` NULL) are read with their extra; only a trigger's event leads to a
range of ``idx_asset_id_timestamp`` (its asset, ``window`` around it), and only copies found there
to the runs that consumed them (``idx_dagrun_asset_events_event_id``). The stranded_events check asks
the same of its sets' events (detector/checks/stranded_events/copies.py): a copy of a consumed message is not re-run.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import Connection

from detector.core.model import Run
from detector.core.trigger_event import Copies, IdPaths, TriggerEvent, copies
from detector.metadb import dag_runs
from detector.metadb.schema import AirflowTables


def near_runs(
    conn: Connection,
    t: AirflowTables,
    runs: Iterable[Run],
    triggers: Iterable[TriggerEvent],
    window: timedelta,
    id_paths: IdPaths,
) -> tuple[list[Copies], list[Run]]:
    """Copies of the messages ``triggers`` (the trigger events ``runs`` consumed, read with their events:
    ``consumption.consumed_with_assets``) carried, and the runs of those DAGs that consumed one."""
    runs = list(runs)
    # Only an id links runs (core.trigger_event): an event without one needs no range read on the poll.
    mine = [e for e in triggers if e.message_ids]
    if not mine:
        return [], []
    ids = {e.id for e in mine}
    near = copies(dag_runs.trigger_events_near(conn, t, mine, window, id_paths=id_paths), window)
    found = [c for c in near if c.proven and c.event_ids & ids]
    return found, consumers(conn, t, found, {r.dag_id for r in runs})


def since(
    conn: Connection, t: AirflowTables, start: datetime | None, window: timedelta, id_paths: IdPaths
) -> tuple[list[Copies], list[Run]]:
    """Every copy set among the trigger events since ``start`` (scan), and the runs that consumed one."""
    events: list[TriggerEvent] = dag_runs.trigger_events_since(conn, t, start, window, id_paths=id_paths)
    found = [c for c in copies(events, window) if c.proven]
    return found, consumers(conn, t, found, None)


def consumers(conn: Connection, t: AirflowTables, found: list[Copies], dag_ids: set[str] | None) -> list[Run]:
    if not found:
        return []
    runs = dag_runs.runs_consuming(conn, t, {e for c in found for e in c.event_ids})
    return [r for r in runs if dag_ids is None or r.dag_id in dag_ids]

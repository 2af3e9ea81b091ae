"""Remediation's reads right before acting (detector/actions/remediation/): the duplicate's state and
the kept run's note. The types live here because the api source reads the same shape over REST."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import (
    Connection,
    select,
)

from detector.metadb.schema import AirflowTables

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

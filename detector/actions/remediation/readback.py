"""After a remediation's write: read the run back and say what really happened (pure).

Between the guard's re-read and the write (for the ``api`` backend: the PATCH reaching Airflow's
``set_dag_run_state_to_failed``) a worker can start a task. Airflow then stops the running task
mid-run, and "done, stopped before start" would be false. Both backends therefore read the run's
task instances again after their write, and ``read_back`` compares that with the guard's re-read.

A task instance the write acted on "had started before the write" when the read-back shows either

1. a state only a started task can have after the write (``STARTED_TI_STATES``: ``failed``,
   ``success``, ``running``, …). From an unstarted state (none, scheduled, queued, …) both writes
   only ever produce ``skipped``: ``set_dag_run_state_to_failed`` marks FAILED exactly the TIs that
   were RUNNING, DEFERRED or UP_FOR_RESCHEDULE and SKIPPED every other unfinished one
   (airflow/api/common/mark_tasks.py L292-333 in 3.1.2, docs/explanation/airflow-internals.md, "What marking a run
   failed does"), and a skip sets ``skipped``.
   ``failed`` therefore means "was running and was stopped", ``success`` "finished in between"; or
2. the marks of the Execution API's ``ti_run``, which a worker calls to move QUEUED -> RUNNING: a
   ``pid`` or ``last_heartbeat_at`` that the guard's re-read did not see (routes/task_instances.py
   L190-197 in 3.1.2). The write's own read can be stale: it then overwrites RUNNING with SKIPPED
   (``TaskInstance.set_state`` also refills ``start_date`` with its own clock), but it never clears
   these two columns. ``start_date`` and ``try_number`` are not used: the write rewrites the first
   with the API server's clock and the scheduler bumps the second when it schedules, not when a
   task runs.

A task that had already started when the guard judged (only with ``remediate_started``; "started"
is ``detector.core.model.ti_started``, the one definition) counts too, whether the write acted on it
(``up_for_retry``, ``restarting``, ``awaiting_input`` are then skipped, yet a try ran) or it had
already finished (``success``, ``failed``: left as they are): the result is ``caught_after_start``
naming it, never ``done``.

A task instance still unfinished after the write (e.g. put back to ``scheduled`` by the scheduler)
means the write did not hold: that is reported as ``failed``, never as ``done``.
"""

from __future__ import annotations

from dataclasses import dataclass

from detector.core.model import STARTED_TI_STATES, ti_started
from detector.core.plan import Mode
from detector.core.ports import Result, StartedTask
from detector.metadb.run_state import RunState, TaskState

# What a run failed through the API before it started lacks: Airflow's set-failed sets
# only end_date (DagRun.set_state, QUEUED -> FAILED), no public endpoint can set start_date
# (DAGRunPatchBody is state and note, 3.0.6-3.3.2), and without one Airflow answers HTTP 500 for its
# asset events (apache/airflow#71360). Said in every such result of the api backend
# (the alert shows it) and by check-config.
NO_START_DATE = (
    "; Airflow leaves its start_date empty, so until apache/airflow#71360 is fixed its asset events "
    "answer HTTP 500 in Airflow's API and UI (the db backend or the in-scheduler guard set it)"
)

# airflow/utils/state.py State.finished (kept here so this module stays a leaf).
_FINISHED = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


@dataclass(frozen=True, slots=True)
class ReadBack:
    """The verdict on one committed write."""

    result: Result  # DONE, CAUGHT_AFTER_START, or FAILED (the write did not hold)
    detail: str
    started: tuple[StartedTask, ...] = ()


def _key(t: TaskState) -> tuple[str, int]:
    return t.task_id, t.map_index


def _ran(before: TaskState, after: TaskState) -> bool:
    if ti_started(before.state, before.pid, before.last_heartbeat_at):  # only with remediate_started
        return True
    if after.state in STARTED_TI_STATES:
        return True
    return (after.pid is not None and after.pid != before.pid) or (
        after.last_heartbeat_at is not None and after.last_heartbeat_at != before.last_heartbeat_at
    )


def read_back(
    mode: Mode,
    acted_on: tuple[TaskState, ...],
    written: str,
    after: RunState | None,
    *,
    ran: tuple[TaskState, ...] = (),
) -> ReadBack:
    """Judge the write of ``written`` (``Work.describe()``) on ``acted_on`` (the TIs as the guard read
    them) from ``after``, the run read again once the write committed; ``ran`` (``Work.ran``): the
    tasks that had started when the guard judged."""
    acted = {_key(t) for t in acted_on}
    now = {_key(t): t for t in after.tasks} if after is not None else {}
    started = [
        StartedTask(t.task_id, t.map_index, t.state, now[_key(t)].state if _key(t) in now else t.state)
        for t in ran
        if _key(t) not in acted
    ]
    if after is None:
        if started:
            return ReadBack(Result.CAUGHT_AFTER_START, f"caught after start: {written} (then deleted)", tuple(started))
        return ReadBack(Result.DONE, f"{written} (the run was deleted right after the write)")
    held_open: list[str] = []
    for before in acted_on:
        current = now.get(_key(before))
        if current is None:
            continue  # removed from the run meanwhile: nothing left to run
        if _ran(before, current):
            started.append(StartedTask(before.task_id, before.map_index, before.state, current.state))
        if current.state not in _FINISHED:
            name = before.task_id if before.map_index < 0 else f"{before.task_id}[{before.map_index}]"
            held_open.append(f"{name}={current.state or 'none'}")
    if mode is Mode.FAIL and after.state != "failed":
        held_open.insert(0, f"run state {after.state or 'none'}")
    if held_open:
        return ReadBack(
            Result.FAILED,
            f"written ({written}) but it did not hold: after the write Airflow shows {', '.join(held_open)}",
            tuple(started),
        )
    if started:
        names = ", ".join(t.describe() for t in started)
        return ReadBack(
            Result.CAUGHT_AFTER_START,
            f"caught after start: {written}, but task(s) had started before the write landed: {names}",
            tuple(started),
        )
    return ReadBack(Result.DONE, written)

"""Task attempts bumped twice (apache/airflow#57618; 3.0.x/3.1.x, fixed in 3.2.0 by PR #60330).

``DagRun.schedule_tis`` updates task instances by id with no state guard and adds 1 to ``try_number``: a scheduler
acting on a stale view sends a TI another scheduler already queued (or a worker already runs) back to ``scheduled``
with try k+1. The running attempt is killed at its next heartbeat and the task runs again
(docs/explanation/airflow-internals.md, "Task attempts bumped twice"). Every legitimate new try (a retry, a clear; an
orphan reset from 3.1.8 on) first writes a ``task_instance_history`` row for try k and gives the TI a new id, so the
race leaves a TI whose earlier try has **no history row**.

Two ways to see it:

* **confirmed** (``dupguard run``): the check remembers the in-flight TIs of its previous pass; the
  same id now has try k+1, was scheduled/queued/running at try k, and try k has no history row.
* **suspected** (``scan``, or a bump the previous pass did not see in flight): a TI at try n >= 2
  whose tries below n lack a history row. Airflow keeps no old id, so "same id" cannot be proven.

Never flagged (the look-alikes): retries and clears (history row); sensors in
reschedule mode and deferrals (the try does not move); rows written by Airflow 2 (no
``dag_version_id``: older than the history table); an orphan reset, which on 3.0/3.1 also sets the
state back with no history row, told apart by what else Airflow recorded (``_reset_possible``): the
previous attempt's scheduler job (or, after the fact, any scheduler job) not running, and the new try
scheduled in the time an orphan reset of its tasks could have come; history possibly purged by ``airflow db clean``
(an archive table of ``task_instance_history`` made after the run was queued). Alert only: an
outsider cannot stop the second attempt in time without killing the only one left.

Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from detector.core.checks import Observation
from detector.core.detect import ALL_DAGS, DagFilter

KIND = "double_bump"
IN_FLIGHT = frozenset({"scheduled", "queued", "running"})
# How far back the scheduler jobs are read: a job dead longer before a bump is not looked at (a reset
# at the start of a scheduler after an outage longer than this is reported).
ORPHAN_WINDOW = timedelta(hours=1)
# From an orphan reset to the scheduler loop that schedules the new try (the reset sets the TI back to
# None; its run's next ``schedule_tis`` bumps it): a loop or two of a busy scheduler.
SCHEDULING_ALLOWANCE = timedelta(seconds=60)

TiKey = tuple[str, str, str, int]  # dag_id, task_id, run_id, map_index


@dataclass(frozen=True)
class TiRow:
    """One ``task_instance`` row as one pass read it (with its run's ``queued_at``)."""

    id: str
    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    state: str | None
    hostname: str | None
    queued_by_job_id: int | None
    scheduled_dttm: datetime | None
    dag_version_id: str | None
    run_queued_at: datetime | None = None

    @property
    def key(self) -> TiKey:
        return (self.dag_id, self.task_id, self.run_id, self.map_index)


@dataclass(frozen=True)
class SchedulerJob:
    id: int
    state: str | None
    latest_heartbeat: datetime | None
    hostname: str | None
    start_date: datetime | None = None
    end_date: datetime | None = None  # set when the job ended itself; an orphan check leaves it NULL


@dataclass(frozen=True)
class OrphanTiming:
    """Airflow's [scheduler] settings that time an orphan reset (dupguard settings, Airflow's defaults)."""

    health_check_threshold: timedelta = timedelta(seconds=30)  # scheduler_health_check_threshold
    check_interval: timedelta = timedelta(seconds=300)  # orphaned_tasks_check_interval


@dataclass(frozen=True)
class Evidence:
    """What Airflow recorded besides the TI rows."""

    history: Mapping[TiKey, frozenset[int]]  # tries with a task_instance_history row
    jobs: Mapping[int, SchedulerJob]  # SchedulerJob rows: the remembered queuers and the dead ones
    purges: tuple[datetime, ...] = ()  # when `airflow db clean` archived task_instance_history rows
    timing: OrphanTiming = OrphanTiming()


@dataclass(frozen=True)
class DoubleBump:
    ti: TiRow  # the row now
    tries: tuple[int, int]  # the try with no history row, the one above it
    confidence: str  # "confirmed" | "suspected"
    earlier: TiRow | None = None  # the same id at the earlier try, as the previous pass saw it
    schedulers: tuple[str, ...] = field(default=())  # hosts of the scheduler jobs involved

    @property
    def key(self) -> str:
        return f"{KIND}:{self.ti.id}:{self.tries[0]}"


def resettable_from(job: SchedulerJob, timing: OrphanTiming) -> datetime | None:
    """From when an orphan check could reset the tasks ``job`` queued (``adopt_or_reset_orphaned_tasks``
    resets TIs whose queuer is not running): from its end if it ended itself (``end_date``; a rolling deploy's
    graceful stop), else once its heartbeat is older than the threshold (the check marks it failed). None: it
    is running, or nothing says when it stopped."""
    if job.state == "running":
        return None
    if job.end_date is not None:
        return job.end_date
    return job.latest_heartbeat + timing.health_check_threshold if job.latest_heartbeat is not None else None


def _reset_possible(
    job: SchedulerJob | None, at: datetime | None, jobs: Mapping[int, SchedulerJob], timing: OrphanTiming
) -> bool:
    """Could an orphan reset of ``job``'s tasks have come before the new try was scheduled at ``at``? After
    ``resettable_from`` (strictly: the check compares ``<``), at the first orphan check: within one
    ``check_interval`` on a scheduler alive then, or at the start of a scheduler started since (its first
    loop runs one); then the loop that schedules the try (``SCHEDULING_ALLOWANCE``)."""
    if job is None or job.state == "running":
        return False
    since = resettable_from(job, timing)
    if at is None or since is None:
        return True  # no time to compare: cannot rule it out
    if at <= since:
        return False
    if at <= since + timing.check_interval + SCHEDULING_ALLOWANCE:
        return True
    return any(
        s.start_date is not None and since <= s.start_date and at <= s.start_date + SCHEDULING_ALLOWANCE
        for s in jobs.values()
    )


def _orphan_reset_possible(ti: TiRow, earlier: TiRow | None, evidence: Evidence) -> bool:
    at, jobs = ti.scheduled_dttm, evidence.jobs
    if earlier is not None and earlier.queued_by_job_id is not None:
        return _reset_possible(jobs.get(earlier.queued_by_job_id), at, jobs, evidence.timing)
    if earlier is not None:
        return False  # never queued at the earlier try: no scheduler to be declared dead
    return any(_reset_possible(job, at, jobs, evidence.timing) for job in jobs.values())


def _purged(ti: TiRow, purges: Iterable[datetime]) -> bool:
    return any(ti.run_queued_at is None or p >= ti.run_queued_at for p in purges)


def find_double_bumps(
    rows: Sequence[TiRow],
    evidence: Evidence,
    memory: Mapping[str, TiRow] | None = None,
    dag_filter: DagFilter = ALL_DAGS,
) -> list[DoubleBump]:
    """The TIs whose try was bumped with no history row, oldest try first per TI."""
    memory = memory or {}
    found: list[DoubleBump] = []
    for ti in rows:
        if ti.try_number < 2 or ti.dag_version_id is None or not dag_filter.selects(ti.dag_id):
            continue
        recorded = evidence.history.get(ti.key, frozenset())
        missing = [k for k in range(1, ti.try_number) if k not in recorded]
        if not missing or _purged(ti, evidence.purges):
            continue
        k = missing[-1]  # the newest bump; older missing tries are in the evidence
        prev = memory.get(ti.id)
        earlier = prev if prev is not None and prev.try_number == k and prev.state in IN_FLIGHT else None
        if _orphan_reset_possible(ti, earlier, evidence):
            continue
        ids = [j for j in (earlier.queued_by_job_id if earlier else None, ti.queued_by_job_id) if j is not None]
        hosts = tuple(dict.fromkeys(h for j in ids if (h := _host(evidence.jobs.get(j)))))
        confidence = "confirmed" if earlier is not None else "suspected"
        found.append(DoubleBump(ti, (k, k + 1), confidence, earlier, hosts))
    return found


def _host(job: SchedulerJob | None) -> str | None:
    return job.hostname if job is not None else None


def observe(bump: DoubleBump, seen_at: datetime) -> Observation:
    ti, (k, k1) = bump.ti, bump.tries
    where = f"{ti.dag_id}.{ti.task_id} run {ti.run_id}" + (f" map_index {ti.map_index}" if ti.map_index >= 0 else "")
    earlier_host = bump.earlier.hostname if bump.earlier else None
    lines = [
        f"task instance {ti.id}: try {k} -> {k1} on the same id, no task_instance_history row for try {k}",
        f"try {k}: {bump.earlier.state} on {earlier_host or 'unknown host'}"
        if bump.earlier
        else f"try {k}: not seen in flight by dupguard (Airflow keeps no earlier id): suspected",
        f"try {k1}: {ti.state or 'none'} on {ti.hostname or 'no host yet'}",
    ]
    if bump.schedulers:
        lines.append(f"schedulers: {', '.join(bump.schedulers)}")
    facts = {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "map_index": ti.map_index,
        "ti_id": ti.id,
        "tries": [k, k1],
        "state": ti.state,
        "hosts": [h for h in (earlier_host, ti.hostname) if h],
        "earlier_state": bump.earlier.state if bump.earlier else None,
        "schedulers": list(bump.schedulers),
        "scheduled_at": ti.scheduled_dttm.isoformat() if ti.scheduled_dttm else None,
    }
    return Observation(
        kind=KIND,
        key=bump.key,
        confidence="confirmed" if bump.confidence == "confirmed" else "suspected",
        severity="error" if bump.confidence == "confirmed" else "warning",
        dag_ids=(ti.dag_id,),
        title=f"Task attempt bumped twice: {where}, tries {k} and {k1}",
        lines=tuple(lines),
        advice=(
            f"Check try {k}'s worker{f' ({earlier_host})' if earlier_host else ''}: it is killed at its next "
            f"heartbeat and the task runs again as try {k1}; make sure the task is idempotent or clean up "
            "its partial output. Upgrade to Airflow 3.2+ (apache/airflow PR #60330)."
        ),
        facts=facts,
        seen_at=seen_at,
        subject=bump,
    )

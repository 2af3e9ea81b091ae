"""Frozen domain objects. Rows become these at the database boundary; the pure core sees nothing else."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

ASSET_TRIGGERED = "asset_triggered"

# A task instance in one of these states has run (or is running), or Airflow ended it (failed,
# success) — either way too late to stop it cleanly. Skipped, removed and upstream_failed are
# deliberately absent: Airflow stamps start_date on tasks it merely skips (ti_started below).
STARTED_TI_STATES = frozenset(
    {
        "running",
        "success",
        "failed",
        "up_for_retry",
        "up_for_reschedule",
        "deferred",
        "restarting",
        "awaiting_input",
    }
)


def ti_started(state: str | None, pid: int | None = None, last_heartbeat_at: datetime | None = None) -> bool:
    """Whether Airflow recorded that this task instance started: the one definition of "started"
    (planning, the remediation guard, the read-back, both sources; docs/explanation/remediation.md).

    Either its state is one of ``STARTED_TI_STATES``, or a worker's ``ti_run`` stamped it: ``ti_run``
    is the only writer of ``pid`` and the first ``last_heartbeat_at`` (execution_api/routes/
    task_instances.py L200-207 in 3.1.2), and neither a retry (``prepare_db_for_next_try`` keeps the
    row's columns), a clear nor a skip resets them. So a task back in ``scheduled``/``queued`` after a
    try, or ``skipped`` by its own code (``AirflowSkipException``), still counts. ``start_date`` is no
    proof (``TaskInstance.set_state`` fills it when Airflow skips or fails a task that never ran), nor
    is ``try_number`` (``DagRun.schedule_tis`` bumps it when it schedules, dagrun.py L2051).
    """
    return state in STARTED_TI_STATES or pid is not None or last_heartbeat_at is not None


class Kind(enum.StrEnum):
    ASSET = "asset"
    PARTITIONED = "partitioned"
    # Runs that consumed different copies of one message, one per triggerer (detector.core.trigger_event).
    TRIGGER_EVENT = "trigger_event"


class Confidence(enum.StrEnum):
    CONFIRMED = "confirmed"
    SUSPECTED = "suspected"


@dataclass(frozen=True, slots=True)
class Run:
    """One ``dag_run`` row, narrowed to what detection needs."""

    id: int
    dag_id: str
    run_id: str
    run_type: str
    run_after: datetime
    state: str | None = None
    partition_key: str | None = None
    creating_job_id: int | None = None
    creator_hostname: str | None = None
    queued_at: datetime | None = None


# How the note of a run made by the in-scheduler guard starts (detector/guard/policy.py _DUPGUARD_NOTE;
# a test keeps the two in step). The daemon recognises guarded runs by it.
GUARD_NOTE_PREFIX = "dupguard guard skipped this run as a duplicate of "


@dataclass(frozen=True, slots=True)
class TaskProgress:
    """What the task instances of one run have done so far."""

    total: int = 0
    started: int = 0
    skipped: int = 0
    task_seconds: float = 0.0
    # The run carries the in-scheduler guard's note (GUARD_NOTE_PREFIX): the guard created it with
    # every task skipped. A run an operator skipped by hand is all_skipped but not guarded.
    guarded: bool = False

    @property
    def any_started(self) -> bool:
        return self.started > 0

    @property
    def all_skipped(self) -> bool:
        return self.total > 0 and self.skipped == self.total


NO_PROGRESS = TaskProgress()


@dataclass(frozen=True, slots=True)
class Decisions:
    """What earlier judgements decided about runs (by ``dag_run.id``), read back as data.

    - ``stopped``: runs that carry the note dupguard or its in-scheduler guard writes when it stops a
      duplicate (Airflow stores it, so it survives any restart);
    - ``duplicates``: runs an earlier judgement chose as duplicates (ledger), stopped or not yet;
    - ``kept``: runs an earlier judgement kept (ledger, or named as the kept run by such a note).

    A stopped or chosen duplicate is never a keep candidate, whatever its tasks did (stopping it may
    itself have failed a task that was starting); a kept run is never remediated.
    """

    stopped: frozenset[int] = frozenset()
    duplicates: frozenset[int] = frozenset()
    kept: frozenset[int] = frozenset()
    # runs whose note is in dupguard's words but Airflow's record disagrees (still queued, tasks not
    # skipped; or the ledger kept it): not a decision, judged afresh (detector.core.decisions)
    disputed: frozenset[int] = frozenset()

    def __or__(self, other: Decisions) -> Decisions:
        return Decisions(
            self.stopped | other.stopped,
            self.duplicates | other.duplicates,
            self.kept | other.kept,
            self.disputed | other.disputed,
        )

    def excluded(self, run_id: int) -> bool:
        """Never a keep candidate: stopped, or chosen as a duplicate, and not kept by any decision."""
        return run_id not in self.kept and (run_id in self.stopped or run_id in self.duplicates)


NO_DECISIONS = Decisions()


@dataclass(frozen=True, slots=True)
class Finding:
    """A group of runs that one asset trigger produced more than once.

    ``kept`` is the run the keep rule preserves; ``duplicates`` are the others, in id order.
    ``key`` is stable for the group's lifetime, so replicas and restarts agree on what was handled.
    """

    key: str
    kind: Kind
    confidence: Confidence
    dag_id: str
    kept: Run
    duplicates: tuple[Run, ...]
    shared_event_ids: tuple[int, ...]
    run_after: datetime
    partition_key: str | None = None
    duplicate_task_seconds: float = 0.0
    progress: dict[int, TaskProgress] = field(default_factory=dict, compare=False, hash=False)
    prior: Decisions = field(default=NO_DECISIONS, compare=False, hash=False)
    # What the alerts name: the assets of the events the group's runs consumed, filled in by the
    # source after detection (``asset_labels``); not part of what makes the group.
    assets: tuple[str, ...] = field(default=(), compare=False, hash=False)

    @property
    def runs(self) -> tuple[Run, ...]:
        return (self.kept, *self.duplicates)

    @property
    def creating_job_ids(self) -> tuple[int | None, ...]:
        return tuple(r.creating_job_id for r in self.runs)


def asset_labels(assets: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """How alerts name assets given as (name, uri): each name, with its URI where that says more
    (Airflow 3 fills ``name`` with the URI when a DAG gives none), sorted, each once."""
    return tuple(sorted({name if not uri or uri == name else f"{name} ({uri})" for name, uri in assets}))


@dataclass(frozen=True, slots=True)
class PartitionRow:
    """One ``asset_partition_dag_run`` row (Airflow 3.2+): a (DAG, partition key) waiting for, or
    having made, its run. ``created_dag_run_id`` is None while the row is pending."""

    id: int
    dag_id: str
    partition_key: str
    created_at: datetime
    created_dag_run_id: int | None = None

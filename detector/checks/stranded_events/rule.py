"""Asset events that trigger nothing (apache/airflow#56050, open in every Airflow 3.0.6-3.3.2).

Airflow queues one ``asset_dag_run_queue`` row per (asset, DAG) with ON CONFLICT DO NOTHING, so the
row keeps the time of the first event after the last run; the scheduler's run consumes the events
up to the newest row's ``created_at`` and deletes the rows. An event registered after that row was
written and before the DELETE is neither consumed nor queued again: the consumer does not run for
it until some unrelated later event arrives (docs/explanation/airflow-internals.md, "Asset events that trigger
nothing").

The rule, per DAG scheduled directly on assets, on rows read in one snapshot:
an event of one of its assets is **stranded** when no run of the DAG consumed it, it is newer than
the run_after of the run that consumed the asset's newest consumed event (that run's window ended
before it), that run was *created after* the event, and the DAG has no queue row at all (any row,
even of another asset, could still make a run that consumes it). Not flagged, each for a reason Airflow's code gives:

* partitioned events (3.2+): queued in ``asset_partition_dag_run``, never in the queue table;
* events linked to an asset alias: alias-scheduled DAGs consume them differently per version
  (3.0.6 never does);
* events at or before the DAG's first schedule reference (3.3 floors a first run there when catchup
  is off: the backlog is skipped on purpose);
* events registered while the DAG was paused (the ``log`` table's pause and unpause records,
  ``rule_pauses``): Airflow queues nothing for a paused DAG by design, and the run a later event makes
  consumes them, whatever happened in between (a run made after the unpause from a row queued before
  the pause included); a DAG paused *now* is not judged at all. When the log cannot say (purged by
  ``airflow db clean``, a bulk or direction-less record, no SELECT on it) the event is still reported,
  as a ``warning``: no ``error`` page rests on a pause state nobody recorded;
* events waiting for an AND/OR condition: their queue row is still there;
* cleared runs: a clear resets ``queued_at``; a run's creation time is ``created_at`` (3.2+) or
  ``queued_at`` of a run never cleared (``clear_number`` 0), otherwise unknown and not evidence.

A stranded event that is a trigger's copy of a message a run of the DAG consumed (two triggerers ran one AssetWatcher
trigger, docs/explanation/airflow-internals.md, "One message, one asset event per triggerer") is kept, as evidence of
the double-run trigger, but marked (``copies``): the message was processed, so nothing is to re-run and the repair
refuses the set (re-queueing would run the consumer again for it).

Pure: rows in, findings out; ``db_now`` is passed in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Protocol, TypeVar

from detector.core.checks import TRIGGER_COPIES_ALERT, Observation
from detector.core.detect import ALL_DAGS, DagFilter
from detector.core.trigger_event import Copies

KIND = "stranded_events"
ADVICE = (
    "The consumer DAG has not run for these asset events and will not until another event of its assets "
    "arrives (apache/airflow#56050). Create one asset event of one of its assets (REST API POST "
    "/api/v2/assets/events, or the UI): the run it triggers consumes these too; check that it did."
)
COPY_ADVICE = (
    "These events are copies of messages a run of the DAG already consumed: the AssetWatcher's trigger ran "
    "on two triggerers (docs/explanation/airflow-internals.md#13-one-message-one-asset-event-per-triggerer). "
    "Nothing to re-run; do not create an event for them. "
    "Find why the trigger ran twice (DupguardTriggerFlapping, the triggerers' logs)."
)


@dataclass(frozen=True)
class CandidateEvent:
    """One asset event newer than its DAG's latest asset run, with that DAG's state (one snapshot)."""

    dag_id: str
    event_id: int
    asset: str  # name (uri) for people
    timestamp: datetime
    consumed: bool  # by any run of this DAG
    via_alias: bool
    partition_key: str | None
    dag_paused: bool
    queue_rows: int  # asset_dag_run_queue rows of this DAG
    schedule_floor: datetime | None  # min(dag_schedule_asset_reference.created_at) of this DAG
    run_id: str  # the DAG's asset-triggered run that consumed this asset's newest consumed event
    run_after: datetime
    run_created_at: datetime | None  # dag_run.created_at (3.2+; NULL on older rows)
    run_queued_at: datetime | None
    run_clear_number: int
    # Paused when registered (``rule_pauses.paused_at``): True, False, or None when the log cannot say.
    paused_then: bool | None = False


@dataclass(frozen=True)
class ConsumedCopy:
    """A stranded event carrying the message of an event a run of its DAG consumed."""

    event_id: int
    of_event: int
    run_id: str  # the run that consumed ``of_event``
    proven: bool  # by a message id; else only an equal payload (maybe two messages with one body)

    def describe(self) -> str:
        how = "a copy (same message id)" if self.proven else "maybe a copy (equal payload, no message id)"
        return f"{how} of event {self.of_event}, which run {self.run_id} consumed"


@dataclass(frozen=True)
class StrandedSet:
    key: str
    dag_id: str
    run_id: str  # the run whose creation stranded them
    run_after: datetime
    run_created: datetime
    events: tuple[CandidateEvent, ...]
    copies: tuple[ConsumedCopy, ...] = ()  # of its events (with_copies)

    @property
    def event_ids(self) -> tuple[int, ...]:
        return tuple(e.event_id for e in self.events)


def with_copies(s: StrandedSet, found: Iterable[Copies], consumers: Mapping[int, Iterable[str]]) -> StrandedSet:
    """``s`` with its events that are copies (``trigger_event.copies``) of an event ``consumers`` (event
    id -> run ids of the set's DAG that consumed it) names; a copy proven by a message id first."""
    ordered = sorted(found, key=lambda c: not c.proven)
    marks = []
    for event_id in s.event_ids:
        for c in (c for c in ordered if event_id in c.event_ids):
            hits = sorted((other, run) for other in c.event_ids - {event_id} for run in consumers.get(other, ()))
            if hits:
                marks.append(ConsumedCopy(event_id, hits[0][0], hits[0][1], c.proven))
                break
    return replace(s, copies=tuple(marks))


def run_created(c: CandidateEvent) -> datetime | None:
    """When the run was created, if Airflow's records say so (a clear rewrites queued_at)."""
    if c.run_created_at is not None:
        return c.run_created_at
    return c.run_queued_at if c.run_clear_number == 0 else None


def is_stranded(c: CandidateEvent) -> bool:
    created = run_created(c)
    return (
        not c.consumed
        and not c.via_alias
        and c.partition_key is None
        and not c.dag_paused
        and c.paused_then is not True
        and c.queue_rows == 0
        and c.timestamp > c.run_after
        and (c.schedule_floor is None or c.timestamp > c.schedule_floor)
        and created is not None
        and created > c.timestamp
    )


class Event(Protocol):
    """What grouping needs of a candidate (``CandidateEvent``, ``stranded_late.LateCandidate``)."""

    @property
    def dag_id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def event_id(self) -> int: ...
    @property
    def asset(self) -> str: ...
    @property
    def timestamp(self) -> datetime: ...


E = TypeVar("E", bound=Event)


def by_run(
    candidates: Iterable[E], keep: Callable[[E], bool], dag_filter: DagFilter, since: datetime | None
) -> list[tuple[str, str, tuple[E, ...]]]:
    """The kept candidates per (DAG, run), sorted, each run's events unique and in time order."""
    runs: dict[tuple[str, str], list[E]] = defaultdict(list)
    for c in candidates:
        if keep(c) and dag_filter.selects(c.dag_id) and (since is None or c.timestamp >= since):
            runs[(c.dag_id, c.run_id)].append(c)
    found = []
    for (dag_id, run_id), events in sorted(runs.items()):
        events.sort(key=lambda e: (e.timestamp, e.event_id))
        found.append((dag_id, run_id, tuple({e.event_id: e for e in events}.values())))
    return found


def events_facts(events: Iterable[Event]) -> list[dict[str, Any]]:
    return [{"id": e.event_id, "asset": e.asset, "timestamp": e.timestamp.isoformat()} for e in events]


def find_stranded(
    candidates: Iterable[CandidateEvent], *, dag_filter: DagFilter = ALL_DAGS, since: datetime | None = None
) -> list[StrandedSet]:
    """One set per (DAG, stranding run), events in time order."""
    found = []
    for dag_id, run_id, unique in by_run(candidates, is_stranded, dag_filter, since):
        created = run_created(unique[0])
        assert created is not None  # is_stranded checked it
        found.append(
            StrandedSet(
                key=f"{KIND}|{dag_id}|{run_id}",
                dag_id=dag_id,
                run_id=run_id,
                run_after=unique[0].run_after,
                run_created=created,
                events=unique,
            )
        )
    return found


def stranded_dict(s: StrandedSet) -> dict[str, Any]:
    return {
        "dag_id": s.dag_id,
        "run_id": s.run_id,
        "run_after": s.run_after.isoformat(),
        "run_created": s.run_created.isoformat(),
        "event_ids": list(s.event_ids),
        "events": events_facts(s.events),
        "copies": [
            {"id": c.event_id, "of_event": c.of_event, "run_id": c.run_id, "proven": c.proven} for c in s.copies
        ],
    }


def observe(s: StrandedSet, db_now: datetime) -> Observation:
    first = s.events[0].timestamp
    copy_of = {c.event_id: c for c in s.copies}
    proven = sum(c.proven for c in s.copies)  # a copy only maybe is counted as a lost event too
    lines = (
        f"run {s.run_id}: consumed events up to {s.run_after.isoformat()}, created {s.run_created.isoformat()}",
        *(
            f"event {e.event_id} of {e.asset} at {e.timestamp.isoformat()}: {_why(copy_of.get(e.event_id))}"
            + ("" if e.paused_then is False else f"; the log cannot say whether {s.dag_id} was paused then")
            for e in s.events
        ),
        f"no queue row left for DAG {s.dag_id}; stranded for {max(0.0, (db_now - first).total_seconds()):.0f} s",
    )
    lost = len(s.events) - proven
    # An error page needs a lost event the log shows registered while the DAG was unpaused.
    certain = [e for e in s.events if e.paused_then is False and not _proven(copy_of.get(e.event_id))]
    title = f"{lost} asset event(s) of DAG {s.dag_id} triggered no run" + (
        f" (and {proven} copy(ies) of consumed events)" if proven else ""
    )
    if not lost:
        title = f"{proven} asset event(s) of DAG {s.dag_id} are copies of consumed events: a trigger ran twice"
    return Observation(
        kind=KIND,
        key=s.key,
        confidence="confirmed" if certain or not lost else "suspected",
        severity="error" if certain else "warning",
        dag_ids=(s.dag_id,),
        title=title,
        lines=lines,
        advice=ADVICE if lost else COPY_ADVICE,
        facts=stranded_dict(s),
        seen_at=db_now,
        subject=s,
        alertname=None if lost else TRIGGER_COPIES_ALERT,  # nothing stranded: a trigger ran twice
    )


def _proven(copy: ConsumedCopy | None) -> bool:
    return copy is not None and copy.proven


def _why(copy: ConsumedCopy | None) -> str:
    if copy is None:
        return "consumed by no run"
    if copy.proven:
        return f"{copy.describe()}: the trigger ran on two triggerers; nothing to re-run"
    return f"consumed by no run; {copy.describe()}"

"""Asset events committed after the run that should have consumed them: lost for good.

An asset event's ``timestamp`` is taken when its producer flushes it, and the producer commits at the
end of its request; the scheduler's run consumes the committed events with ``previous run_after <
timestamp <= run_after``. An event whose timestamp falls in that window but which was committed after the run's
SELECT is consumed by no run: not by that run (it could not see it), and not by any later one (their windows start at
or after that run's run_after), whatever is queued later (docs/explanation/airflow-internals.md, "Committed late").
Same kind as ``detector.checks.stranded_events.rule``, another reason, because the remedy differs: another event does
not rescue it.

Airflow records no commit time, so the rule reads the shape, per (DAG, scheduled asset), on rows of one
snapshot: an event consumed by no run of the DAG, newer than the asset's newest event consumed by an
*earlier* asset-triggered run of the DAG (the window's lower end, which also keeps out the events of
runs ``airflow db clean`` purged: they are older than every event a kept run consumed) and at or before
the run_after of the run that consumed the asset's newest consumed event. Not flagged:

* partitioned events and events linked to an asset alias (as in ``detector.checks.stranded_events.rule``);
* events at or before the (asset, DAG) schedule reference's ``created_at``: the asset was not in the
  DAG's schedule when that run read its window (and 3.3's catchup floor is older still);
* events that a queue row of the DAG can still take: a row created at or after the event and before
  that run_after makes a run whose window reaches back over it (a DAG on several assets whose
  producer's own row survived the DELETE uncommitted);
* DAGs paused or stale now (the read's gate).

A run deleted by a person takes its links to the events with it (``ON DELETE CASCADE``): its events
look the same and are reported (they too are consumed by no run, for good).

Pure: rows in, findings out; ``db_now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from detector.checks.stranded_events.rule import KIND, by_run, events_facts
from detector.core.checks import Observation
from detector.core.detect import ALL_DAGS, DagFilter

REASON = "committed_late"
ADVICE = (
    "These asset events were committed after the consumer's run had read its events, with timestamps "
    "inside that run's window: no run will consume them, and another event does not change that (each "
    "later run's window starts after them). If the work they stand for is needed, trigger the consumer "
    "DAG by hand (its run consumes no asset event) or re-emit the events. dupguard does not repair them: "
    "a queue row would make a run that consumes the window's other events a second time."
)


@dataclass(frozen=True)
class LateCandidate:
    """An asset event consumed by no run of the DAG, inside the window of the DAG's latest asset run."""

    dag_id: str
    event_id: int
    asset: str  # name (uri) for people
    timestamp: datetime
    via_alias: bool
    partition_key: str | None
    schedule_since: datetime | None  # created_at of the DAG's reference to this asset
    run_id: str  # the asset-triggered run that consumed the asset's newest consumed event
    run_after: datetime
    window_from: datetime  # the asset's newest event consumed by an earlier asset run of the DAG
    queue_newest: datetime | None  # max(asset_dag_run_queue.created_at) of the DAG


@dataclass(frozen=True)
class LateSet:
    key: str
    dag_id: str
    run_id: str  # the run whose window held them
    run_after: datetime
    events: tuple[LateCandidate, ...]

    @property
    def event_ids(self) -> tuple[int, ...]:
        return tuple(e.event_id for e in self.events)


def is_committed_late(c: LateCandidate) -> bool:
    rescuable = c.queue_newest is not None and c.timestamp <= c.queue_newest < c.run_after
    return (
        not c.via_alias
        and c.partition_key is None
        and c.window_from < c.timestamp <= c.run_after
        and (c.schedule_since is None or c.timestamp > c.schedule_since)
        and not rescuable
    )


def find_late(
    candidates: Iterable[LateCandidate], *, dag_filter: DagFilter = ALL_DAGS, since: datetime | None = None
) -> list[LateSet]:
    """One set per (DAG, window run), events in time order."""
    return [
        LateSet(key=f"{KIND}|{REASON}|{d}|{r}", dag_id=d, run_id=r, run_after=events[0].run_after, events=events)
        for d, r, events in by_run(candidates, is_committed_late, dag_filter, since)
    ]


def late_dict(s: LateSet) -> dict[str, Any]:
    return {
        "reason": REASON,
        "dag_id": s.dag_id,
        "run_id": s.run_id,
        "run_after": s.run_after.isoformat(),
        "event_ids": list(s.event_ids),
        "events": events_facts(s.events),
    }


def observe_late(s: LateSet, db_now: datetime) -> Observation:
    lines = (
        f"run {s.run_id}: consumed events up to {s.run_after.isoformat()}",
        *(
            f"event {e.event_id} of {e.asset} at {e.timestamp.isoformat()}: committed after run {s.run_id} "
            "read its events: no later run will consume it"
            for e in s.events
        ),
    )
    return Observation(
        kind=KIND,
        key=s.key,
        confidence="confirmed",
        severity="error",
        dag_ids=(s.dag_id,),
        title=f"{len(s.events)} asset event(s) of DAG {s.dag_id} committed too late for any run",
        lines=lines,
        advice=ADVICE,
        facts=late_dict(s),
        seen_at=db_now,
        subject=s,
    )

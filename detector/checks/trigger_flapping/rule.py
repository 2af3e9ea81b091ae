"""Triggers claimed by every triggerer (apache/airflow PR #65792, callbacks PR #72848).

Up to 3.2.1 ``Trigger.get_sorted_triggers`` selects asset (AssetWatcher) triggers without the "owner is not an alive
triggerer" filter, and deadline-callback triggers lack it through 3.3.2 (docs/explanation/airflow-internals.md,
"Triggers claimed by every triggerer"). Each triggerer loop (about once a second) then re-claims such a trigger from
the other, alive, triggerer and runs it too: every copy emits its own asset event (the consumers run once per copy,
unlinked: the events differ) and a deadline callback can fire twice.

Airflow keeps no history of owners, so the condition is seen live: ``judge_owners`` compares the
owner of each trigger with the owner seen at the previous look (memory kept by the caller). An owner
change is flapping only when the previous owner was alive throughout, judged as Airflow judges a
triggerer alive (``end_date IS NULL`` and ``latest_heartbeat`` within
``[triggerer] triggerer_health_check_threshold``), on the database's clock:

* its job is running and not ended now, and its heartbeat is fresh now;
* its heartbeat seen at the previous look (``h0``, fresh then) and now (``h1``) are less than the
  threshold apart: every gap between two of its heartbeats in between was shorter, so it never went
  stale, and the change cannot be Airflow's legitimate takeover from a stale triggerer.

A triggerer whose heartbeat went stale and came back, one that ended, and a trigger deleted and
re-created (a new ``(id, created_date)``) are never flapping. ``exposure`` is what one look
(``dupguard scan``) can say instead: the release lacks the filter for a trigger's kind, and two
triggerer jobs were alive at the same time while the trigger existed, on the jobs' own timestamps.

Pure: rows in, records out; ``db_now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

ASSET, CALLBACK = "asset", "callback"

# Trigger kinds whose claim query lacks the alive-owner filter, per schema family (Family's value):
# True when every release of the family lacks it, False when some do (one alembic head covers 3.2.0
# to 3.2.x, and only 3.2.2 filters asset triggers). Callback (deadline) triggers exist from 3.1.
UNPROTECTED: Mapping[str, Mapping[str, bool]] = {
    "3.0": {ASSET: True},
    "3.1": {ASSET: True, CALLBACK: True},
    "3.2": {ASSET: False, CALLBACK: True},
    "3.3": {CALLBACK: True},  # through 3.3.2; PR #72848 (the fix) is not in a release yet
}


@dataclass(frozen=True, slots=True)
class TriggerRow:
    """One ``trigger`` row that feeds an asset or a deadline callback, with what it feeds."""

    id: int
    created_date: datetime
    triggerer_id: int | None
    kind: str  # ASSET or CALLBACK
    assets: tuple[str, ...]  # asset names (asset triggers)
    dag_ids: tuple[str, ...]  # the consumer DAGs of those assets, or the DAG of the missed deadline
    asset_ids: tuple[int, ...] = ()  # asset triggers: the ids of ``assets`` (their events' asset_id)

    @property
    def identity(self) -> tuple[int, datetime]:
        """A re-created trigger is another trigger even if its id came back (SQLite reuses ids)."""
        return (self.id, self.created_date)


@dataclass(frozen=True, slots=True)
class TriggererJob:
    """One ``job`` row of type TriggererJob."""

    id: int
    hostname: str | None
    state: str | None
    start_date: datetime | None
    end_date: datetime | None
    latest_heartbeat: datetime | None

    def alive(self, db_now: datetime, threshold: timedelta) -> bool:
        """Airflow's own test (``Trigger.assign_unassigned``), plus the job's state."""
        return (
            self.end_date is None
            and self.state == "running"
            and self.latest_heartbeat is not None
            and db_now - self.latest_heartbeat < threshold
        )


@dataclass(frozen=True, slots=True)
class Owner:
    """The owner of a trigger at one look, and that owner's heartbeat then."""

    job_id: int
    heartbeat: datetime | None
    seen_at: datetime


Memory = Mapping[tuple[int, datetime], Owner]


@dataclass(frozen=True, slots=True)
class Flap:
    """An owner change while the previous owner stayed alive."""

    trigger: TriggerRow
    previous: TriggererJob
    current: TriggererJob | None  # None: the new owner's job row is gone
    previous_seen_at: datetime
    seen_at: datetime


@dataclass(frozen=True, slots=True)
class Exposure:
    """A trigger of a kind the release does not protect, while two triggerers were alive at once."""

    trigger: TriggerRow
    jobs: tuple[TriggererJob, TriggererJob]  # the first overlapping pair
    overlap_start: datetime
    overlap_end: datetime
    certain_version: bool  # False: the schema cannot tell a fixed release from an affected one


def judge_owners(
    triggers: Iterable[TriggerRow],
    jobs: Iterable[TriggererJob],
    memory: Memory,
    db_now: datetime,
    threshold: timedelta,
) -> tuple[list[Flap], dict[tuple[int, datetime], Owner]]:
    """The flaps since the previous look, and the memory for the next one (only triggers that exist)."""
    by_id = {j.id: j for j in jobs}
    flaps: list[Flap] = []
    remembered: dict[tuple[int, datetime], Owner] = {}
    for trigger in triggers:
        if trigger.triggerer_id is None:
            continue
        owner_job = by_id.get(trigger.triggerer_id)
        now_owner = Owner(trigger.triggerer_id, owner_job.latest_heartbeat if owner_job else None, db_now)
        before = memory.get(trigger.identity)
        remembered[trigger.identity] = now_owner
        if before is None or before.job_id == trigger.triggerer_id:
            continue
        previous = by_id.get(before.job_id)
        if previous is not None and _alive_throughout(before, previous, db_now, threshold):
            flaps.append(Flap(trigger, previous, owner_job, before.seen_at, db_now))
    return flaps, remembered


def _alive_throughout(before: Owner, previous: TriggererJob, db_now: datetime, threshold: timedelta) -> bool:
    h0, h1 = before.heartbeat, previous.latest_heartbeat
    if h0 is None or h1 is None or not previous.alive(db_now, threshold):
        return False
    return before.seen_at - h0 < threshold and h1 - h0 < threshold


def alive_at(jobs: Iterable[TriggererJob], at: datetime, threshold: timedelta) -> int:
    """How many triggerer jobs were alive at ``at`` by their own timestamps: from ``start_date`` to
    ``end_date``, or, still running, to ``latest_heartbeat`` plus the threshold (Airflow's alive test
    counts a triggerer alive until its heartbeat is that old; only the latest beat is kept)."""
    count = 0
    for j in jobs:
        until = j.end_date or (j.latest_heartbeat + threshold if j.latest_heartbeat else None)
        if j.start_date is not None and until is not None and j.start_date <= at < until:
            count += 1
    return count


def exposure(
    triggers: Iterable[TriggerRow],
    jobs: Sequence[TriggererJob],
    unprotected: Mapping[str, bool],
    since: datetime | None = None,
) -> list[Exposure]:
    """Triggers of an ``unprotected`` kind (value: whether the release is known for certain) that
    existed while two triggerer jobs were alive at the same time (after ``since``, if given).

    A job is taken as alive from its ``start_date`` to its ``end_date`` or, if it has none, its last
    heartbeat: the database's own timestamps, no clock of ours.
    """
    spans = sorted(
        ((j.start_date, j.end_date or j.latest_heartbeat, j) for j in jobs if j.start_date is not None),
        key=lambda s: (s[0], s[2].id),
    )
    out: list[Exposure] = []
    for trigger in triggers:
        if trigger.kind not in unprotected:
            continue
        pair = _first_overlap(spans, not_before=max(filter(None, (since, trigger.created_date))))
        if pair is not None:
            out.append(Exposure(trigger, pair[0], pair[1], pair[2], unprotected[trigger.kind]))
    return out


def _first_overlap(
    spans: Sequence[tuple[datetime, datetime | None, TriggererJob]], not_before: datetime
) -> tuple[tuple[TriggererJob, TriggererJob], datetime, datetime] | None:
    for i, (start_a, end_a, a) in enumerate(spans):
        for start_b, end_b, b in spans[i + 1 :]:
            if end_a is None or end_b is None:
                continue
            start, end = max(start_a, start_b), min(end_a, end_b)
            if start < end and end > not_before:
                return (a, b), max(start, not_before), end
    return None

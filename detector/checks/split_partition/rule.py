"""Split pending partitions: one (DAG, partition key) whose events landed in two
``asset_partition_dag_run`` rows (apache/airflow#71070, open; fix proposed in #71074).

Pure: rows in, findings out; ``now`` is passed in.

Why the rule holds (docs/explanation/airflow-internals.md, "A partition key split into two pending rows"):
``AssetManager._get_or_create_apdr`` (airflow/assets/manager.py, 3.3.2 L712) takes the *newest* row of (target DAG,
key) and reuses it while it is pending; it creates a new row only when the newest row already has its run. Its lock
is the producer's asset row, so two events of two different assets registered at the same time
both see no pending row and both insert one. Hence a pending row that is not the newest row of its
(DAG, key) exists only through that split: no later event will ever join it. A consumer on
``a1 & a2`` then waits for ever (each row holds one asset's event); a consumer on ``a1 | a2`` gets
one run per row (those runs are a duplicate group, see ``detector.core.reprocess``).

The split is reported once it has lasted ``grace``: for an OR consumer both rows get their runs
within one scheduler pass (milliseconds), and a grace period keeps that transient out of alerts.
Nothing here is remediated: merging rows means writing Airflow's scheduling state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from detector.core.checks import Observation
from detector.core.detect import ALL_DAGS, DagFilter
from detector.core.model import PartitionRow

KIND = "split_partition"
DEFAULT_SPLIT_GRACE = timedelta(seconds=60)
ADVICE = (
    "Airflow wrote this partition key's asset events into two asset_partition_dag_run rows "
    "(apache/airflow#71070): a consumer that needs both waits for ever, one that needs either runs twice. "
    "dupguard changes nothing; check whether the DAG must be triggered for this key by hand."
)


@dataclass(frozen=True, slots=True)
class SplitRow:
    """One row of a split: its events (partitioned_asset_key_log) and age at detection."""

    id: int
    created_at: datetime
    created_dag_run_id: int | None
    event_ids: tuple[int, ...]
    age_seconds: float

    @property
    def pending(self) -> bool:
        return self.created_dag_run_id is None


@dataclass(frozen=True, slots=True)
class SplitPartition:
    """A (DAG, partition key) with a pending row that no event will ever join.

    ``rows``: the stuck rows (pending, not the newest) and the newest row, by id. ``key`` is stable
    for the split's lifetime (the lowest stuck row id), so it is alerted once.
    """

    key: str
    dag_id: str
    partition_key: str
    rows: tuple[SplitRow, ...]
    split_at: datetime  # creation of the next row read after the oldest stuck one (next pending, else newest)

    @property
    def kind(self) -> str:
        return KIND

    @property
    def stuck_row_ids(self) -> tuple[int, ...]:
        newest = self.rows[-1].id
        return tuple(r.id for r in self.rows if r.pending and r.id != newest)

    @property
    def waiting(self) -> bool:
        """No row of the split has made a run yet: the consumer has not run for this key."""
        return all(r.pending for r in self.rows)


def find_split_partitions(
    rows: Iterable[PartitionRow],
    events: Mapping[int, frozenset[int]],
    now: datetime,
    *,
    grace: timedelta = DEFAULT_SPLIT_GRACE,
    dag_filter: DagFilter = ALL_DAGS,
) -> list[SplitPartition]:
    """Every split among ``rows`` that has lasted at least ``grace`` at ``now``.

    ``rows`` must hold every pending row and the newest row of each (DAG, key) that has a pending
    row (``statements.partition_rows_with_pending``; other rows are ignored); ``events`` maps row id to
    its asset event ids.
    Sorted by (dag_id, partition_key).
    """
    by_key: dict[tuple[str, str], list[PartitionRow]] = defaultdict(list)
    for row in rows:
        if dag_filter.selects(row.dag_id):
            by_key[(row.dag_id, row.partition_key)].append(row)
    found: list[SplitPartition] = []
    for (dag_id, partition_key), group in sorted(by_key.items()):
        group.sort(key=lambda r: r.id)
        newest = group[-1]
        stuck = [r for r in group[:-1] if r.created_dag_run_id is None]
        if not stuck:
            continue
        after_first = next(r for r in group if r.id > stuck[0].id)
        split_at = max(stuck[0].created_at, after_first.created_at)
        if now - split_at < grace:
            continue
        found.append(
            SplitPartition(
                key=f"{KIND}|{dag_id}|{partition_key}|{stuck[0].id}",
                dag_id=dag_id,
                partition_key=partition_key,
                rows=tuple(
                    SplitRow(
                        id=r.id,
                        created_at=r.created_at,
                        created_dag_run_id=r.created_dag_run_id,
                        event_ids=tuple(sorted(events.get(r.id, frozenset()))),
                        age_seconds=max(0.0, (now - r.created_at).total_seconds()),
                    )
                    for r in [*stuck, newest]
                ),
                split_at=split_at,
            )
        )
    return found


def _iso_or_none(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def split_dict(split: SplitPartition) -> dict[str, Any]:
    """The one description of a split, shared by `scan --format json`, the log line and the webhook."""
    return {
        "key": split.key,
        "kind": split.kind,
        "dag_id": split.dag_id,
        "partition_key": split.partition_key,
        "split_at": _iso_or_none(split.split_at),
        "waiting": split.waiting,
        "stuck_row_ids": list(split.stuck_row_ids),
        "rows": [
            {
                "id": r.id,
                "created_at": _iso_or_none(r.created_at),
                "age_seconds": round(r.age_seconds, 3),
                "pending": r.pending,
                "created_dag_run_id": r.created_dag_run_id,
                "event_ids": list(r.event_ids),
            }
            for r in split.rows
        ],
    }


def row_line(split: SplitPartition, index: int, when: Callable[[datetime], str | None] = _iso_or_none) -> str:
    r = split.rows[index]
    made = "pending" if r.pending else f"made dag_run id {r.created_dag_run_id}"
    events = ", ".join(map(str, r.event_ids)) or "none"
    return f"row {r.id}: created {when(r.created_at)} ({r.age_seconds:.0f} s ago), {made}, asset events {events}"


def observe(split: SplitPartition, db_now: datetime) -> Observation:
    """The split as a periodic check's observation (``detector.checks.split_partition.check``)."""
    state = "the consumer waits for ever" if split.waiting else "an orphaned pending row: it may run twice"
    return Observation(
        kind=KIND,
        key=split.key,
        confidence="confirmed",
        severity="error" if split.waiting else "warning",
        dag_ids=(split.dag_id,),
        title=f"Split partition key {split.partition_key} of DAG {split.dag_id}: {state}",
        lines=tuple(row_line(split, i) for i in range(len(split.rows))),
        advice=ADVICE,
        facts=split_dict(split),
        seen_at=db_now,
        subject=split,
    )

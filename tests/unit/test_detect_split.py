"""Split partition keys (apache/airflow#71070) and partition re-processing vs race: the pure rules."""

from __future__ import annotations

from datetime import timedelta

from detector.checks.split_partition.rule import find_split_partitions
from detector.core.detect import DagFilter, find_duplicates
from detector.core.model import Confidence, Kind, PartitionRow
from detector.core.reprocess import refine_partitioned
from tests.factories import T0, run

MS = timedelta(milliseconds=1)
GRACE = timedelta(seconds=60)


def row(id: int, at: timedelta, made: int | None = None, dag: str = "consumer", key: str = "k") -> PartitionRow:
    return PartitionRow(id=id, dag_id=dag, partition_key=key, created_at=T0 + at, created_dag_run_id=made)


def test_two_pending_rows_of_one_key_are_a_split_after_the_grace_period() -> None:
    """Both rows pending (an AND consumer that never runs): reported once the split lasted ``grace``."""
    rows = [row(1, 0 * MS), row(2, 1 * MS)]
    events = {1: frozenset({20}), 2: frozenset({10})}
    assert find_split_partitions(rows, events, T0 + 30 * MS, grace=GRACE) == []
    [split] = find_split_partitions(rows, events, T0 + timedelta(minutes=5), grace=GRACE)
    assert (split.dag_id, split.partition_key, split.kind) == ("consumer", "k", "split_partition")
    assert [(r.id, r.event_ids, r.pending) for r in split.rows] == [(1, (20,), True), (2, (10,), True)]
    assert split.stuck_row_ids == (1,) and split.waiting
    assert split.rows[0].age_seconds == 300.0
    assert split.key == "split_partition|consumer|k|1"


def test_a_pending_row_below_a_row_that_made_its_run_is_still_a_split() -> None:
    """Airflow reuses only the newest pending row: an older pending row is never joined again."""
    rows = [row(1, 0 * MS), row(2, 1 * MS, made=7)]
    [split] = find_split_partitions(rows, {}, T0 + timedelta(hours=1), grace=GRACE)
    assert split.stuck_row_ids == (1,) and not split.waiting


def test_one_pending_row_or_resolved_rows_are_not_a_split() -> None:
    """The ordinary life of a key: a row waits for its events, earlier rows made their runs."""
    later = T0 + timedelta(days=1)
    assert find_split_partitions([row(1, 0 * MS)], {}, later) == []
    assert find_split_partitions([row(1, 0 * MS, made=5), row(2, 10 * MS)], {}, later) == []
    assert find_split_partitions([row(1, 0 * MS, made=5), row(2, 10 * MS, made=6)], {}, later) == []


def test_rows_of_different_keys_or_dags_are_not_a_split() -> None:
    """Fan-out to several keys or DAGs gives one pending row each, never a split."""
    rows = [row(1, 0 * MS, key="a"), row(2, 0 * MS, key="b"), row(3, 0 * MS, dag="other", key="a")]
    assert find_split_partitions(rows, {}, T0 + timedelta(days=1)) == []


def test_dag_filter_applies_to_splits() -> None:
    rows = [row(1, 0 * MS), row(2, 1 * MS)]
    assert find_split_partitions(rows, {}, T0 + timedelta(days=1), dag_filter=DagFilter(exclude=("cons*",))) == []


def _suspected(a_after: timedelta, b_after: timedelta) -> tuple[list, dict]:  # type: ignore[type-arg]
    a = run(id=3, partition_key="k", run_after=T0 + a_after)
    b = run(id=4, partition_key="k", run_after=T0 + b_after)
    events = {3: frozenset({1}), 4: frozenset({2})}
    findings = find_duplicates([a, b], events)
    assert [f.confidence for f in findings] == [Confidence.SUSPECTED]
    return findings, events


def test_reprocessing_whose_second_row_came_after_the_first_run_is_not_reported() -> None:
    """Second row created after the first run existed: the pending periods never overlapped."""
    findings, events = _suspected(20 * MS, 2 * 1000 * MS)
    origins = {3: row(1, 0 * MS, made=3), 4: row(2, 1900 * MS, made=4)}
    assert refine_partitioned(findings, origins, events) == []


def test_runs_from_rows_pending_at_the_same_time_are_a_confirmed_duplicate_group() -> None:
    """Second row created before the first run: the split; its two runs are one duplicate group."""
    findings, events = _suspected(24 * MS, 42 * MS)
    origins = {3: row(1, 0 * MS, made=3), 4: row(2, 1 * MS, made=4)}
    [f] = refine_partitioned(findings, origins, events)
    assert (f.kind, f.confidence) == (Kind.PARTITIONED, Confidence.CONFIRMED)
    assert f.kept.id == 3 and [r.id for r in f.duplicates] == [4]
    assert f.key == "partitioned-split|consumer|k|3"


def test_a_run_without_its_own_row_stays_suspected() -> None:
    """3.2's race loser has no row pointing at it: nothing proves a re-processing, so it stays suspected."""
    findings, events = _suspected(0 * MS, 3 * MS)
    [f] = refine_partitioned(findings, {4: row(2, 0 * MS, made=4)}, events)
    assert f == findings[0]


def test_a_split_pair_and_a_later_reprocessing_are_told_apart() -> None:
    """Three runs of one key within the window: the split pair is confirmed, the re-run is dropped."""
    a = run(id=3, partition_key="k", run_after=T0 + 24 * MS)
    b = run(id=4, partition_key="k", run_after=T0 + 42 * MS)
    c = run(id=6, partition_key="k", run_after=T0 + timedelta(seconds=5))
    events = {3: frozenset({1}), 4: frozenset({2}), 6: frozenset({3})}
    findings = find_duplicates([a, b, c], events)
    origins = {3: row(1, 0 * MS, made=3), 4: row(2, 1 * MS, made=4), 6: row(5, timedelta(seconds=4), made=6)}
    [f] = refine_partitioned(findings, origins, events)
    assert f.confidence is Confidence.CONFIRMED
    assert sorted(r.id for r in f.runs) == [3, 4]


def test_confirmed_and_asset_findings_pass_through_untouched() -> None:
    a, b = run(id=1, partition_key="k"), run(id=2, partition_key="k", run_after=T0 + 3 * MS)
    events = {1: frozenset({9}), 2: frozenset({9})}
    findings = find_duplicates([a, b], events)
    assert refine_partitioned(findings, {}, events) == findings

"""Detection and planning behaviour that mutation testing found unpinned (benchmarks/results/mutation.md).

Each test states a contract of the pure core (its docstrings, docs/explanation/remediation.md) that a surviving
mutant of ``detector/core/detect.py`` or ``plan.py`` broke while every other test passed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from detector.core.detect import DEFAULT_SUSPECT_WINDOW, find_duplicates
from detector.core.model import Confidence, Decisions, Kind, PartitionRow, TaskProgress
from detector.core.plan import NOTE_LIMIT, Mode, Outcome, note_for, plan
from detector.core.reprocess import refine_partitioned
from tests.factories import T0, run

MS = timedelta(milliseconds=1)
STARTED = TaskProgress(total=1, started=1)


def test_every_action_names_its_finding_dag_mode_and_note() -> None:
    """What the executors and the ledger key on: the finding's key, its DAG, the mode planned, and
    the note that will be written on the run."""
    [f] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({5}), 2: frozenset({5})})
    for mode in (Mode.FAIL, Mode.SKIP, Mode.DRY_RUN):
        [action] = plan([f], mode, now=T0)
        assert (action.finding_key, action.dag_id, action.mode) == (f.key, "consumer", mode)
        assert action.note == note_for(f, f.duplicates[0], T0) and action.note.startswith("dupguard stopped")


def test_a_suspected_group_is_planned_not_confirmed_in_every_mode_but_off() -> None:
    """The outcome says why nothing is done (the report and the metrics show it)."""
    [f] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({5}), 2: frozenset({6})})
    for mode in Mode:
        [action] = plan([f], mode, now=T0)
        assert action.outcome is Outcome.NOT_CONFIRMED


def test_the_note_lists_every_shared_event() -> None:
    """docs/explanation/remediation.md's note: "Shared asset events: 5, 6." for a pair that shares two events."""
    events = {1: frozenset({6, 5}), 2: frozenset({5, 6})}
    [f] = find_duplicates([run(id=1), run(id=2)], events)
    assert "Shared asset events: 5, 6. At " in note_for(f, f.duplicates[0], T0)


def test_the_note_of_a_split_duplicate_says_it_shares_no_event() -> None:
    """A split partition (apache/airflow#71070) is confirmed from its rows while its two runs consumed
    different events: the note says so instead of leaving the list blank."""
    a = run(id=3, partition_key="k", run_after=T0 + 24 * MS)
    b = run(id=4, partition_key="k", run_after=T0 + 42 * MS)
    events = {3: frozenset({1}), 4: frozenset({2})}
    origins = {3: _row(1, 0 * MS, made=3), 4: _row(2, 1 * MS, made=4)}
    [f] = refine_partitioned(find_duplicates([a, b], events), origins, events)
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.writes and "Shared asset events: none. At " in action.note


def test_a_note_of_exactly_the_column_size_is_written_whole() -> None:
    """dag_run_note.content is varchar(1000): a 1000-character note fits and is not cut."""
    events = {1: frozenset({5}), 2: frozenset({5})}
    [short] = find_duplicates([run(id=1), run(id=2)], events)
    room = NOTE_LIMIT - len(note_for(short, short.duplicates[0], T0))
    kept = replace(run(id=1), run_id=short.kept.run_id + "x" * room)
    [f] = find_duplicates([kept, run(id=2)], events)
    note = note_for(f, f.duplicates[0], T0)
    assert len(note) == NOTE_LIMIT and note.endswith(".") and kept.run_id in note


def test_the_kept_run_stands_for_its_class_in_a_suspected_partition_group() -> None:
    """Two runs of one partition with the same events (confirmed; the ledger kept run 2) and a re-run
    with new events close by (suspected): the suspected group holds the kept run, never its duplicate."""
    runs = [run(id=i, partition_key="k", run_after=T0 + i * MS) for i in (1, 2, 3)]
    events = {1: frozenset({7}), 2: frozenset({7}), 3: frozenset({8})}
    findings = find_duplicates(runs, events, prior=Decisions(kept=frozenset({2})))
    confirmed = next(f for f in findings if f.confidence is Confidence.CONFIRMED)
    suspected = next(f for f in findings if f.confidence is Confidence.SUSPECTED)
    assert confirmed.kept.id == 2 and [d.id for d in confirmed.duplicates] == [1]
    assert sorted(r.id for r in suspected.runs) == [2, 3] and suspected.kept.id == 2


def test_two_confirmed_classes_of_one_partition_have_their_own_stable_keys() -> None:
    """A finding's key is stored (ledger, alert deduplication) and compared across replicas and
    releases: it is pinned here literally. Two races on one partition key are two groups."""
    runs = [run(id=i, partition_key="k", run_after=T0 + i * MS) for i in (1, 2, 3, 4)]
    events = {1: frozenset({3, 1, 2}), 2: frozenset({1, 2, 3}), 3: frozenset({7}), 4: frozenset({7})}
    keys = sorted(f.key for f in find_duplicates(runs, events) if f.confidence is Confidence.CONFIRMED)
    assert keys == ["partitioned|consumer|k|7902699be42c8a8e", "partitioned|consumer|k|8a6ae15122001229"]


def test_two_runs_of_one_partition_without_events_are_suspected() -> None:
    """Runs that consumed nothing cannot be confirmed, but two of them made close together are
    reported (each is its own representative)."""
    runs = [run(id=1, partition_key="k"), run(id=2, partition_key="k", run_after=T0 + 5 * MS)]
    [f] = find_duplicates(runs, {})
    assert (f.kind, f.confidence) == (Kind.PARTITIONED, Confidence.SUSPECTED)
    assert sorted(r.id for r in f.runs) == [1, 2]


def test_runs_exactly_the_suspect_window_apart_are_within_it() -> None:
    """The window is inclusive: a re-run ``suspect_window`` after the first is still suspected."""
    runs = [run(id=1, partition_key="k"), run(id=2, partition_key="k", run_after=T0 + DEFAULT_SUSPECT_WINDOW)]
    [f] = find_duplicates(runs, {1: frozenset({1}), 2: frozenset({2})})
    assert f.confidence is Confidence.SUSPECTED and len(f.runs) == 2
    later = [runs[0], replace(runs[1], run_after=T0 + DEFAULT_SUSPECT_WINDOW + MS)]
    assert find_duplicates(later, {1: frozenset({1}), 2: frozenset({2})}) == []


def _row(id: int, at: timedelta, made: int) -> PartitionRow:
    return PartitionRow(id=id, dag_id="consumer", partition_key="k", created_at=T0 + at, created_dag_run_id=made)


def _split_of_three(progress: dict[int, TaskProgress], prior: Decisions) -> list[int]:
    """Runs 2 and 3 of key k come from rows pending at once (a split); run 1's row had made its run
    before theirs were created (a re-processing): the group of three is judged again as the pair
    (2, 3). Returns the kept run's id, then the duplicates'."""
    runs = [run(id=i, partition_key="k", run_after=T0 + i * MS) for i in (1, 2, 3)]
    events = {1: frozenset({10}), 2: frozenset({20}), 3: frozenset({30})}
    [suspected] = find_duplicates(runs, events, progress, prior=prior)
    origins = {1: _row(11, 0 * MS, made=1), 2: _row(12, MS * 3 / 2, made=2), 3: _row(13, MS * 8 / 5, made=3)}
    [f] = refine_partitioned([suspected], origins, events, progress)
    assert f.confidence is Confidence.CONFIRMED
    return [f.kept.id, *(d.id for d in f.duplicates)]


def test_a_split_judged_again_keeps_its_started_run() -> None:
    """Re-judging the pair uses the group's own earlier decisions only: with none, the keep rule's
    "a run whose tasks started wins" still holds."""
    assert _split_of_three({3: STARTED}, Decisions()) == [3, 2]


def test_a_split_judged_again_never_keeps_a_run_chosen_as_a_duplicate() -> None:
    """Run 3 was chosen as a duplicate before (ledger) and started too late to stop: re-judging the
    pair still never keeps it."""
    assert _split_of_three({3: STARTED}, Decisions(duplicates=frozenset({3}))) == [2, 3]

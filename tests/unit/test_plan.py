"""Planning: the safety rules that decide which runs may be touched."""

from __future__ import annotations

from detector.core.detect import find_duplicates
from detector.core.model import Finding, TaskProgress
from detector.core.plan import NOTE_LIMIT, Mode, Outcome, note_for, plan
from tests.factories import T0, run


def _finding(events_b: frozenset[int] = frozenset({1}), progress: dict[int, TaskProgress] | None = None) -> Finding:
    [f] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({1}), 2: events_b}, progress or {})
    return f


def test_confirmed_duplicate_is_remediated_and_kept_run_never() -> None:
    """Only the duplicate gets an action; the kept run is never named as a target."""
    f = _finding()
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.outcome is Outcome.REMEDIATE and action.writes
    assert action.run.id == 2 and action.kept_run_id == f.kept.run_id


def test_suspected_group_is_never_remediated() -> None:
    """A suspected group yields no write in any mode."""
    f = _finding(events_b=frozenset({9}))
    for mode in Mode:
        assert not any(a.writes for a in plan([f], mode, now=T0))


def test_dry_run_and_off_never_write() -> None:
    """dry-run says what it would do; off does nothing."""
    assert plan([_finding()], Mode.DRY_RUN, now=T0)[0].outcome is Outcome.WOULD_REMEDIATE
    assert plan([_finding()], Mode.OFF, now=T0)[0].outcome is Outcome.DISABLED


def test_started_duplicate_is_too_late_unless_opted_in() -> None:
    """Once the duplicate's tasks have started both ran: report, do not touch (unless opted in)."""
    started = {1: TaskProgress(1, 1), 2: TaskProgress(1, 1)}
    f = _finding(progress=started)
    assert plan([f], Mode.SKIP, now=T0)[0].outcome is Outcome.TOO_LATE
    assert plan([f], Mode.SKIP, now=T0, remediate_started=True)[0].outcome is Outcome.REMEDIATE


def test_guard_skipped_duplicate_is_prevented() -> None:
    """A duplicate the guard created (its note: every task skipped at creation) needs nothing more."""
    f = _finding(progress={2: TaskProgress(total=3, skipped=3, guarded=True)})
    assert plan([f], Mode.FAIL, now=T0)[0].outcome is Outcome.PREVENTED


def test_duplicate_skipped_by_hand_is_not_prevented() -> None:
    """Every task skipped but no guard note (an operator did it): not "prevented"; the remediation
    then finds nothing left to stop and reports that (ALREADY), as it really happened."""
    f = _finding(progress={2: TaskProgress(total=3, skipped=3)})
    assert plan([f], Mode.FAIL, now=T0)[0].outcome is Outcome.REMEDIATE


def test_note_names_kept_run_and_events_and_fits_airflow() -> None:
    """The note points at the kept run and stays within dag_run_note's 1000 characters."""
    f = _finding()
    note = note_for(f, f.duplicates[0], T0)
    assert f.kept.run_id in note and "Shared asset events: 1." in note
    big = find_duplicates([run(id=1), run(id=2)], {1: frozenset(range(1000)), 2: frozenset(range(1000))})[0]
    assert len(note_for(big, big.duplicates[0], T0)) == NOTE_LIMIT


def test_note_names_the_airflow_bug_of_its_kind() -> None:
    """A partitioned duplicate's note links the partitioned race, not the 3.0/3.1 queue race."""
    f = _finding()
    assert "apache/airflow#54491" in note_for(f, f.duplicates[0], T0)
    runs = [run(id=1, partition_key="2026-01-01"), run(id=2, partition_key="2026-01-01")]
    [p] = find_duplicates(runs, {1: frozenset({1}), 2: frozenset({1})}, {})
    assert p.kind.value == "partitioned"
    note = note_for(p, p.duplicates[0], T0)
    assert "apache/airflow#68045" in note and "54491" not in note


def test_guarded_run_is_never_kept_even_with_the_lower_id() -> None:
    """The guard may keep the higher-id run (it took the lock first): the sidecar keeps that one too
    and reports the lower-id guarded run as prevented, never remediating the only live run."""
    f = _finding(progress={1: TaskProgress(total=3, skipped=3, guarded=True), 2: TaskProgress(total=3)})
    assert f.kept.id == 2 and [r.id for r in f.duplicates] == [1]
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.run.id == 1 and action.outcome is Outcome.PREVENTED

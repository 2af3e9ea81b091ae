"""Earlier keep decisions as data (a decision is final): read from notes and ledger roles; the keep rule and the
plan honour them."""

from __future__ import annotations

from dataclasses import replace

from detector.core.decisions import decisions_from_notes, decisions_from_roles
from detector.core.detect import find_duplicates
from detector.core.model import Decisions, TaskProgress
from detector.core.plan import Mode, Outcome, note_for, plan
from tests.factories import T0, run

EVENTS = {1: frozenset({7}), 2: frozenset({7}), 3: frozenset({7})}
FAILED_TASK = TaskProgress(total=2, started=1, skipped=1)  # what stopping a starting task leaves


def test_a_stopped_run_with_a_failed_task_is_never_kept() -> None:
    """Without the earlier decision the failed task makes run 2 look started (kept); with it, never."""
    runs = [run(id=1), run(id=2)]
    [forgetful] = find_duplicates(runs, EVENTS, {2: FAILED_TASK})
    assert forgetful.kept.id == 2  # the trap the decision data closes
    [f] = find_duplicates(runs, EVENTS, {2: FAILED_TASK}, prior=Decisions(stopped=frozenset({2})))
    assert f.kept.id == 1
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.run.id == 2 and action.outcome is Outcome.STOPPED_BEFORE and not action.writes


def test_a_kept_run_stays_kept_when_another_starts_and_is_never_remediated() -> None:
    """Run 2 started after run 1 was kept (too late for it); run 3 joins: run 1 stays kept, run 3 goes."""
    runs = [run(id=1), run(id=2), run(id=3)]
    prior = Decisions(duplicates=frozenset({2}), kept=frozenset({1}))
    [f] = find_duplicates(runs, EVENTS, {2: TaskProgress(total=2, started=1)}, prior=prior)
    assert f.kept.id == 1
    outcomes = {a.run.id: a.outcome for a in plan([f], Mode.FAIL, now=T0)}
    assert outcomes == {2: Outcome.TOO_LATE, 3: Outcome.REMEDIATE}


def test_a_run_kept_before_is_never_remediated_even_when_not_kept_now() -> None:
    """Two conflicting earlier keeps (e.g. split-brain): the one not kept now is left alone."""
    [f] = find_duplicates([run(id=1), run(id=2)], EVENTS, prior=Decisions(kept=frozenset({1, 2})))
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.outcome is Outcome.KEPT_BEFORE and not action.writes


def test_notes_of_dupguard_and_of_the_guard_name_the_kept_run() -> None:
    """Both notes mark their run stopped and the run they name kept; other notes mean nothing."""
    a, b, c, other = run(id=1), run(id=2), run(id=3), replace(run(id=4), dag_id="other")
    [f] = find_duplicates([a, b], EVENTS)
    notes = {
        2: note_for(f, b, T0),
        3: f"dupguard guard skipped this run as a duplicate of {a.run_id} (HA scheduler race, apache/airflow#54491)",
        4: f"dupguard stopped this run as a duplicate of {a.run_id} (same asset trigger…",  # another DAG's run
        1: "re-run by hand after the outage",
    }
    found = decisions_from_notes([a, b, c, other], notes)
    assert found.stopped == {2, 3, 4} and found.kept == {1}


def test_ledger_roles_become_decisions_by_run() -> None:
    a, b = run(id=1), run(id=2)
    roles = {(a.dag_id, a.run_id): {"kept"}, (b.dag_id, b.run_id): {"duplicate"}, ("x", "y"): {"kept"}}
    assert decisions_from_roles([a, b], roles) == Decisions(duplicates=frozenset({2}), kept=frozenset({1}))

"""A note in dupguard's words counts as a decision only where Airflow's record agrees:
the run failed, or its tasks were all skipped without starting. These pin that contract where the
mutation run (benchmarks/results/mutation.md, "core/decisions.py and sources/database/prior.py") found it untested.

``progress`` below is shaped as the sources read it (``consumption.progress_and_notes``): one entry per run
that has task instances, none for a run without any, and a task counts as started or skipped, not both.
"""

from __future__ import annotations

from dataclasses import replace

from detector.core.decisions import decisions_from_notes
from detector.core.model import TaskProgress
from tests.factories import run

KEPT, GUARDED, OTHER = run(id=1), run(id=2), run(id=3)
GUARD_NOTE = f"dupguard guard skipped this run as a duplicate of {KEPT.run_id} (HA scheduler race)"
STOP_NOTE = f"dupguard stopped this run as a duplicate of {KEPT.run_id} (same asset trigger)"
ALL_SKIPPED = TaskProgress(total=3, skipped=3, guarded=True)  # what the guard leaves: nothing started


def test_a_guard_note_on_a_run_whose_tasks_were_all_skipped_unstarted_is_a_decision() -> None:
    """The guard's runs end ``success`` with every task skipped before starting: their note counts."""
    guarded = replace(GUARDED, state="success")
    found = decisions_from_notes([KEPT, guarded], {guarded.id: GUARD_NOTE}, {guarded.id: ALL_SKIPPED})
    assert found.stopped == {guarded.id} and found.kept == {KEPT.id} and found.disputed == frozenset()


def test_a_note_on_a_queued_run_without_task_instances_decides_nothing() -> None:
    """Airflow recorded no task instance for the run yet (no progress entry) and it is queued: a copied
    note is disputed, not a decision, and not an error."""
    found = decisions_from_notes([KEPT, GUARDED], {GUARDED.id: STOP_NOTE}, {})
    assert found.stopped == frozenset() and found.kept == frozenset() and found.disputed == {GUARDED.id}


def test_a_disputed_note_does_not_hide_a_later_runs_agreeing_note() -> None:
    """Run 2's copied note is disputed (queued, nothing skipped); run 3 failed under dupguard's note:
    run 3 is still a decision, naming run 1 kept."""
    failed = replace(OTHER, state="failed")
    progress = {GUARDED.id: TaskProgress(total=3), failed.id: TaskProgress(total=3, started=1, skipped=2)}
    found = decisions_from_notes([KEPT, GUARDED, failed], {GUARDED.id: STOP_NOTE, failed.id: STOP_NOTE}, progress)
    assert found.disputed == {GUARDED.id} and found.stopped == {failed.id} and found.kept == {KEPT.id}

"""``judge_kept``: the last look at the kept run before a duplicate is stopped (never both runs of a
group). Task states as Airflow's own code leaves them: set-failed skips unstarted tasks and fails
running ones; a worker's ``ti_run`` stamps pid and heartbeat; the guard's note skips every task.
The real-database and real-API cases are in tests/integration/test_kept_run_stopped_meanwhile.py and
test_fencing.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detector.actions.remediation.guarded import judge_kept
from detector.core.decisions import REMEDIATION_NOTE_PREFIX
from detector.core.model import GUARD_NOTE_PREFIX
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import Result
from detector.metadb.run_state import KeptRun, RunState, TaskState
from tests.factories import run

BEAT = datetime(2026, 11, 30, 4, 10, 29, tzinfo=UTC)
ACTION = Action("k", "d", run("d", id=2), "kept", Outcome.REMEDIATE, Mode.FAIL, "note")


def _kept(state: str | None, *tasks: TaskState, note: str | None = None) -> KeptRun:
    return KeptRun(RunState(id=1, dag_id="d", run_id="kept", state=state, tasks=tasks), note)


def _refusal(kept: KeptRun | None) -> str:
    verdict = judge_kept(ACTION, kept)
    assert verdict is not None and verdict.work is None and verdict.result is Result.SKIPPED
    assert verdict.detail.startswith("refused: the kept run kept ") and verdict.detail.endswith(
        "this run is left alone"
    )
    return verdict.detail


@pytest.mark.parametrize(
    "kept",
    [
        _kept("queued", TaskState("extract", -1, None)),
        _kept("running", TaskState("extract", -1, "running", 4242, BEAT)),
        _kept("success", TaskState("extract", -1, "success", 4242, BEAT)),
        # it ran and failed on its own: it did the group's work, its duplicate is still stopped
        _kept("failed", TaskState("extract", -1, "failed", 4242, BEAT), TaskState("load", -1, "upstream_failed")),
        # a task skipped by its own code (AirflowSkipException) ran: pid and heartbeat say so
        _kept("success", TaskState("extract", -1, "skipped", 4242, BEAT)),
        _kept("queued"),  # no task instances yet: not stopped
        _kept("queued", TaskState("extract", -1, None), note="re-run after the outage, see ticket 42"),
    ],
    ids=["queued", "running", "succeeded", "ran-and-failed", "skipped-by-own-code", "no-tasks-yet", "operator-note"],
)
def test_a_kept_run_that_stands_lets_the_duplicate_be_stopped(kept: KeptRun) -> None:
    assert judge_kept(ACTION, kept) is None


def test_a_gone_kept_run_refuses() -> None:
    assert "no longer exists" in _refusal(None)


@pytest.mark.parametrize("prefix", [REMEDIATION_NOTE_PREFIX, GUARD_NOTE_PREFIX])
def test_a_kept_run_stopped_with_a_note_refuses_even_if_a_task_had_started(prefix: str) -> None:
    """A late write that caught the kept run's task starting (set-failed fails it): the run was stopped
    as a duplicate, not failed by its own work; its partner must stay."""
    note = prefix + "dup (same asset trigger)"
    kept = _kept("failed", TaskState("extract", -1, "failed", 4242, BEAT), TaskState("load", -1, "skipped"), note=note)
    assert "was stopped as a duplicate (its note in dupguard's words), state failed" in _refusal(kept)


@pytest.mark.parametrize("prefix", [REMEDIATION_NOTE_PREFIX, GUARD_NOTE_PREFIX])
def test_a_stop_note_on_a_run_airflow_shows_unstopped_is_no_refusal(prefix: str) -> None:
    """dupguard's writes put the note and the stop in one transaction (fail) or the note after the skip:
    a note on a run still queued with unskipped tasks is an operator's copy, no decision."""
    assert judge_kept(ACTION, _kept("queued", TaskState("extract", -1, None), note=prefix + "dup (x")) is None


@pytest.mark.parametrize(
    "kept",
    [
        _kept("failed", TaskState("extract", -1, "skipped"), TaskState("load", -1, "skipped")),
        _kept("failed"),
        # a queued task failed by Airflow before any worker ran it: failed, but never started
        _kept("failed", TaskState("extract", -1, "upstream_failed")),
        # skip mode or the guard: every task skipped, the run still queued
        _kept("queued", TaskState("extract", -1, "skipped"), TaskState("load", -1, "removed")),
        _kept("success", TaskState("extract", -1, "skipped")),
    ],
    ids=["failed-all-skipped", "failed-no-tasks", "failed-upstream", "queued-all-skipped", "success-all-skipped"],
)
def test_a_kept_run_stopped_before_it_ran_refuses(kept: KeptRun) -> None:
    detail = _refusal(kept)
    assert f"was stopped before any task ran, state {kept.state.state};" in detail


def test_one_started_task_is_enough_to_stand() -> None:
    """Every other task skipped, one ran (a heartbeat without pid still proves ti_run)."""
    kept = _kept("failed", TaskState("extract", -1, "failed", None, BEAT), TaskState("load", -1, "skipped"))
    assert judge_kept(ACTION, kept) is None


@pytest.mark.parametrize(
    "task",
    [
        TaskState("extract", -1, "skipped", 4242, None),  # skipped by its own code: ti_run's pid alone
        TaskState("extract", -1, "skipped", None, BEAT),  # ... or its first heartbeat alone
        TaskState("extract", -1, "failed", None, None),  # a started state alone (Airflow failed it)
    ],
    ids=["pid-only", "heartbeat-only", "started-state-only"],
)
def test_each_mark_of_a_start_alone_makes_a_stopped_kept_run_stand(task: TaskState) -> None:
    """The one definition of started (``ti_started``), each of its three proofs on its own: the kept
    run ended with every other task skipped, yet one task ran, so it did the work (mutation survivors)."""
    kept = _kept("failed", task, TaskState("load", -1, "skipped"))
    assert judge_kept(ACTION, kept) is None

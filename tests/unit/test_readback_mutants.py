"""The read-back's verdicts and the words the alert shows for them (benchmarks/results/mutation.md, "readback.py"):
each of ``ti_run``'s two marks alone proves a task ran, and every detail is pinned whole, as an
operator reads it. Task states are the ones Airflow's writes leave (see test_remediation_readback.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

from detector.actions.remediation.readback import read_back
from detector.core.plan import Mode
from detector.core.ports import Result, StartedTask
from detector.metadb.run_state import RunState, TaskState

BEAT = datetime(2026, 11, 30, 4, 10, 29, tzinfo=UTC)
QUEUED = (TaskState("extract", -1, "queued"),)


def _run(*tasks: TaskState, state: str | None = "failed") -> RunState:
    return RunState(id=7, dag_id="d", run_id="r", state=state, tasks=tasks)


def test_a_worker_pid_alone_proves_the_task_ran() -> None:
    """ti_run stamped the pid, the first heartbeat had not landed yet, and the stale write skipped it."""
    checked = read_back(Mode.FAIL, QUEUED, "run -> failed", _run(TaskState("extract", -1, "skipped", 4242)))
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "queued", "skipped"),)


def test_a_heartbeat_alone_proves_the_task_ran() -> None:
    after = _run(TaskState("extract", -1, "skipped", None, BEAT))
    checked = read_back(Mode.FAIL, QUEUED, "run -> failed", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "queued", "skipped"),)


def test_a_run_deleted_after_the_write_with_a_task_that_had_run_is_caught_after_start() -> None:
    """With remediate_started: extract had finished when judged, the run is gone after the write."""
    done = TaskState("extract", -1, "success", 11, BEAT)
    checked = read_back(Mode.FAIL, (TaskState("load", -1, None),), "run -> failed", None, ran=(done,))
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.detail == "caught after start: run -> failed (then deleted)"
    assert checked.started == (StartedTask("extract", -1, "success", "success"),)


def test_a_write_that_did_not_hold_names_the_run_state_and_every_open_task() -> None:
    acted = (TaskState("extract", 0, "queued"), TaskState("extract", 1, "queued"), TaskState("load", -1, None))
    after = _run(
        TaskState("extract", 0, None),
        TaskState("extract", 1, "skipped", 4242, BEAT),
        TaskState("load", -1, "scheduled"),
        state=None,
    )
    checked = read_back(Mode.FAIL, acted, "run -> failed", after)
    assert checked.result is Result.FAILED
    assert checked.detail == (
        "written (run -> failed) but it did not hold: after the write Airflow shows "
        "run state none, extract[0]=none, load=scheduled"
    )
    assert checked.started == (StartedTask("extract", 1, "queued", "skipped"),)


def test_a_task_removed_meanwhile_does_not_hide_the_next_one_left_open() -> None:
    acted = (TaskState("gone", -1, None), TaskState("load", -1, None))
    checked = read_back(
        Mode.SKIP, acted, "skipped: gone, load", _run(TaskState("load", -1, "scheduled"), state="queued")
    )
    assert checked.result is Result.FAILED
    assert (
        checked.detail
        == "written (skipped: gone, load) but it did not hold: after the write Airflow shows load=scheduled"
    )


def test_caught_after_start_names_every_task_that_ran() -> None:
    acted = (TaskState("extract", -1, None), TaskState("load", -1, None))
    after = _run(TaskState("extract", -1, "failed", 4242, BEAT), TaskState("load", -1, "success", 4243, BEAT))
    checked = read_back(Mode.FAIL, acted, "run -> failed", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.detail == (
        "caught after start: run -> failed, but task(s) had started before the write landed: "
        "extract (none -> failed), load (none -> success)"
    )


def test_a_retry_pending_task_without_worker_marks_had_started() -> None:
    """With remediate_started: ``up_for_retry`` is a started state even when Airflow failed the try
    before a worker stamped it (no pid, no heartbeat); the write skips it, yet it is no stop before start."""
    before = (TaskState("extract", -1, "up_for_retry"),)
    checked = read_back(Mode.FAIL, before, "run -> failed", _run(TaskState("extract", -1, "skipped")), ran=before)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "up_for_retry", "skipped"),)


def test_either_mark_of_an_earlier_try_alone_says_that_try_ran() -> None:
    """Back in ``scheduled`` with only a pid, or only a heartbeat, left by an earlier try (the write
    keeps both columns as they are): caught after start, not done."""
    for before in (TaskState("extract", -1, "scheduled", 11), TaskState("extract", -1, "scheduled", None, BEAT)):
        after = _run(TaskState("extract", -1, "skipped", before.pid, before.last_heartbeat_at))
        checked = read_back(Mode.FAIL, (before,), "run -> failed", after, ran=(before,))
        assert checked.result is Result.CAUGHT_AFTER_START, before
        assert checked.started == (StartedTask("extract", -1, "scheduled", "skipped"),)


def test_a_task_that_had_run_is_reported_in_the_state_read_back() -> None:
    """Left alone by the write (finished when judged) but cleared by an operator meanwhile: the
    result says what the read-back shows (none), not what the guard saw (success)."""
    done = TaskState("extract", -1, "success", 11, BEAT)
    after = _run(TaskState("extract", -1, None, 11, BEAT), TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, (TaskState("load", -1, None),), "run -> failed", after, ran=(done,))
    assert checked.started == (StartedTask("extract", -1, "success", None),)

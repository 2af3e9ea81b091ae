"""The read-back after a remediation's write (detector.actions.remediation.readback): what really happened.

The task states are the ones Airflow's own code produces (mark_tasks.set_dag_run_state_to_failed,
the Execution API's ti_run); the real-server cases are in tests/integration/test_remediation_api*.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

from detector.actions.remediation.guarded import judge
from detector.actions.remediation.readback import read_back
from detector.core.detect import find_duplicates
from detector.core.model import Run, ti_started
from detector.core.plan import Action, Mode, plan
from detector.core.ports import Result, StartedTask
from detector.metadb.run_state import RunState, TaskState
from tests.factories import T0, run

BEAT = datetime(2026, 11, 30, 4, 10, 29, tzinfo=UTC)


def _run(*tasks: TaskState, state: str = "failed") -> RunState:
    return RunState(id=7, dag_id="d", run_id="r", state=state, tasks=tasks)


UNSTARTED = (TaskState("extract", -1, None), TaskState("load", -1, None))


def test_every_task_skipped_by_the_write_is_done() -> None:
    after = _run(TaskState("extract", -1, "skipped"), TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, UNSTARTED, "run -> failed", after)
    assert checked.result is Result.DONE and checked.started == () and checked.detail == "run -> failed"


def test_a_task_failed_by_set_failed_had_started_and_is_named() -> None:
    """set-failed marks FAILED only what was running: the task started between re-read and write."""
    after = _run(TaskState("extract", -1, "failed", 4242, BEAT), TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, UNSTARTED, "run -> failed", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, None, "failed"),)
    assert "extract (none -> failed)" in checked.detail


def test_a_task_that_finished_in_the_window_counts_as_started() -> None:
    after = _run(TaskState("extract", -1, "success"), TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, UNSTARTED, "run -> failed", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert [t.after for t in checked.started] == ["success"]


def test_a_running_task_overwritten_to_skipped_by_a_stale_write_is_told_by_ti_run_marks() -> None:
    """The write's own read was stale: RUNNING became SKIPPED, but ti_run's pid and heartbeat stay."""
    queued = (TaskState("extract", 0, "queued"), TaskState("extract", 1, "queued"))
    after = _run(
        TaskState("extract", 0, "skipped", 4242, BEAT),
        TaskState("extract", 1, "skipped"),
        state="queued",
    )
    checked = read_back(Mode.SKIP, queued, "skipped: extract[0], extract[1]", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", 0, "queued", "skipped"),)
    assert "extract[0] (queued -> skipped)" in checked.detail


def test_marks_of_an_earlier_try_say_that_try_ran() -> None:
    """A task back in ``scheduled`` whose row still carries a worker's pid and heartbeat had a try
    that ran (prepare_db_for_next_try keeps them): stopping it now is not a stop before start."""
    before = (TaskState("extract", -1, "scheduled", 11, BEAT),)
    after = _run(TaskState("extract", -1, "skipped", 11, BEAT))
    checked = read_back(Mode.FAIL, before, "run -> failed", after, ran=before)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "scheduled", "skipped"),)


def test_a_task_that_had_finished_before_the_write_is_named_though_not_written() -> None:
    """With remediate_started a finished task (extract=success) is left as it is, but it ran."""
    done = TaskState("extract", -1, "success", 11, BEAT)
    after = _run(done, TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, (TaskState("load", -1, None),), "run -> failed", after, ran=(done,))
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "success", "success"),)


def test_ti_started_is_what_airflow_recorded() -> None:
    """The one definition: a started state, or a worker's ti_run marks; never start_date alone."""
    assert all(ti_started(s) for s in ("running", "up_for_retry", "restarting", "awaiting_input", "success", "failed"))
    assert not any(ti_started(s) for s in (None, "scheduled", "queued", "skipped", "upstream_failed", "removed"))
    assert ti_started("queued", 4242) and ti_started("skipped", None, BEAT)


def test_remediate_started_stopping_a_running_task_is_caught_after_start() -> None:
    """With remediate_started the task was running when judged: stopped mid-run, reported so."""
    before = (TaskState("extract", -1, "running", 9, BEAT), TaskState("load", -1, None))
    after = _run(TaskState("extract", -1, "failed", 9, BEAT), TaskState("load", -1, "skipped"))
    checked = read_back(Mode.FAIL, before, "run -> failed", after)
    assert checked.result is Result.CAUGHT_AFTER_START
    assert checked.started == (StartedTask("extract", -1, "running", "failed"),)


def test_tasks_put_back_by_the_scheduler_are_a_failure_not_done() -> None:
    """The 3.0/3.1 scheduler's schedule_tis can set skipped TIs back to scheduled: the stop did not hold."""
    after = _run(TaskState("extract", -1, "scheduled"), TaskState("load", -1, "skipped"), state="queued")
    checked = read_back(Mode.SKIP, UNSTARTED, "skipped: extract, load", after)
    assert checked.result is Result.FAILED
    assert "did not hold" in checked.detail and "extract=scheduled" in checked.detail


def test_a_fail_that_left_the_run_unfailed_is_a_failure() -> None:
    after = _run(TaskState("extract", -1, "skipped"), TaskState("load", -1, "skipped"), state="running")
    checked = read_back(Mode.FAIL, UNSTARTED, "run -> failed", after)
    assert checked.result is Result.FAILED and "run state running" in checked.detail


def test_a_run_deleted_right_after_the_write_is_still_reported_as_written() -> None:
    checked = read_back(Mode.FAIL, UNSTARTED, "run -> failed", None)
    assert checked.result is Result.DONE and "deleted right after the write" in checked.detail


def _judge(*tasks: TaskState) -> str:
    action = plan_one(run(id=7))
    verdict = judge(action, _run(*tasks, state="running"), remediate_started=False)
    assert verdict.result is Result.TOO_LATE
    return verdict.detail


def plan_one(duplicate: Run) -> Action:
    [finding] = find_duplicates([run(id=6), duplicate], {6: frozenset({1}), 7: frozenset({1})}, {})
    [action] = plan([finding], Mode.FAIL, now=T0)
    return action


def test_too_late_says_both_ran_only_when_a_worker_ran_a_task() -> None:
    """A task Airflow failed while still queued (no worker pid, no heartbeat: the worker could not
    reach the API) did not run: the too-late verdict must not claim both runs executed."""
    ran = _judge(TaskState("extract", -1, "failed", 4242, BEAT))
    assert "both runs executed" in ran and "extract=failed" in ran
    never = _judge(TaskState("extract", -1, "failed"), TaskState("load", -1, None))
    assert "both runs executed" not in never
    assert "before any worker ran" in never and "extract=failed" in never
    running = _judge(TaskState("extract", -1, "running", 4242, BEAT))
    assert "both runs executed" in running

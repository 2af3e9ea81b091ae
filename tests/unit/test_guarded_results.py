"""What the remediation executor reports and logs, pinned whole where mutation testing found it
unpinned (benchmarks/results/mutation.md): one ``remediation`` line and one count per outcome, the
planner's results for actions that write nothing, the refusals, and how a write's changes are named.
What is reported must be what happened. The real-database cases are in
tests/integration/test_guarded_execute.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.guarded import (
    GuardedRemediator,
    Verdict,
    Work,
    _describe,
    judge,
    now_utc,
    passive_result,
)
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import RemediationResult, Result
from detector.metadb.run_state import RunState, TaskState
from detector.metrics import Metrics
from tests.factories import run

ACTION = Action("key-1", "consumer", run(id=2), "kept-1", Outcome.REMEDIATE, Mode.FAIL, "the note")


def _remediator(mode: Mode = Mode.FAIL) -> tuple[GuardedRemediator, Metrics]:
    """Its clock reads 10 s, then 10.25034 s: an attempt of ``execute`` takes 250.3 ms (logged to 0.1 ms)."""
    metrics = Metrics()
    ticks = iter([10.0, 10.25034])
    remediator = GuardedRemediator(
        configured_mode=mode, backend=None, engine=None, tables=None, metrics=metrics, clock=lambda: next(ticks)
    )
    return remediator, metrics


def _count(metrics: Metrics, mode: str, result: str, backend: str = "none") -> float | None:
    labels = {"mode": mode, "backend": backend, "result": result}
    return metrics.registry.get_sample_value("dupguard_remediations_total", labels)


def _line(action: Action, result: str, detail: str, level: str, **more: Any) -> dict[str, Any]:
    return {
        "logger_name": "dupguard.remediation",
        "event": "remediation",
        "log_level": level,
        "result": result,
        "mode": action.mode.value,
        "outcome": action.outcome.value,
        "backend": "none",
        "dag_id": action.dag_id,
        "run_id": action.run.run_id,
        "kept_run_id": action.kept_run_id,
        "finding_key": action.finding_key,
        "detail": detail,
        "started_tasks": [],
        "elapsed_ms": 0.0,
    } | more


@pytest.mark.parametrize(
    ("result", "detail", "level"),
    [
        (Result.DONE, "run -> failed", "info"),
        (Result.ALREADY, "the run is already failed", "info"),
        (Result.SKIPPED, "refused: the kept run kept-1 no longer exists; this run is left alone", "warning"),
        (Result.SKIPPED, "group not confirmed: never remediated", "info"),
        (Result.FAILED, "queue full", "warning"),
        (Result.TOO_LATE, "too late", "warning"),
        (Result.CAUGHT_AFTER_START, "caught", "warning"),
        (Result.UNKNOWN, "read-back failed", "warning"),
    ],
)
def test_a_recorded_result_is_one_whole_line_and_one_count(result: Result, detail: str, level: str) -> None:
    """Warnings for what needs a look (a failure, a late or unproven stop, a refusal), info else."""
    remediator, metrics = _remediator()
    with capture_logs() as logs:
        remediator.record(RemediationResult(ACTION, result, detail))
    assert logs == [_line(ACTION, result.value, detail, level)]
    assert _count(metrics, "fail", result.value) == 1
    assert metrics.registry.get_sample_value("dupguard_remediation_latency_seconds_count") == 0


PASSIVE = [
    (Outcome.TOO_LATE, Result.TOO_LATE, "too late: its tasks had left queued when planned; left alone"),
    (Outcome.PREVENTED, Result.ALREADY, "the in-scheduler guard created it with every task skipped"),
    (Outcome.NOT_CONFIRMED, Result.SKIPPED, "group not confirmed: never remediated"),
    (Outcome.DISABLED, Result.SKIPPED, "remediation is off"),
    (Outcome.STOPPED_BEFORE, Result.ALREADY, "its note says dupguard already stopped it"),
    (Outcome.KEPT_BEFORE, Result.SKIPPED, "an earlier decision kept this run: never remediated"),
]


@pytest.mark.parametrize(("outcome", "result", "detail"), PASSIVE, ids=[p[0].value for p in PASSIVE])
def test_an_action_that_writes_nothing_reports_the_planners_reason(
    outcome: Outcome, result: Result, detail: str
) -> None:
    """Nothing is read (no database here): the planner's outcome is the result, told and logged."""
    action = replace(ACTION, outcome=outcome)
    assert passive_result(action) == RemediationResult(action, result, detail)
    remediator, metrics = _remediator()
    with capture_logs() as logs:
        assert remediator.execute(action) == RemediationResult(action, result, detail)
    level = "warning" if result is Result.TOO_LATE else "info"
    assert logs == [_line(action, result.value, detail, level, elapsed_ms=250.3)]
    assert _count(metrics, "fail", result.value) == 1


@pytest.mark.parametrize("outcome", [Outcome.REMEDIATE, Outcome.WOULD_REMEDIATE])
def test_an_action_a_worker_carries_out_has_no_passive_result(outcome: Outcome) -> None:
    assert passive_result(replace(ACTION, outcome=outcome)) is None


def test_an_action_on_the_kept_run_is_refused_and_logged_as_a_failure() -> None:
    action = replace(ACTION, kept_run_id=ACTION.run.run_id)
    remediator, metrics = _remediator()
    with capture_logs() as logs:
        result = remediator.execute(action)
    assert (result.result, result.detail, result.retryable) == (Result.FAILED, "refused: this is the kept run", False)
    assert logs == [_line(action, "failed", "refused: this is the kept run", "warning", elapsed_ms=250.3)]
    assert _count(metrics, "fail", "failed") == 1


def test_a_dry_run_with_nothing_to_read_is_skipped_as_off() -> None:
    """Remediation off reads nothing: a write action reaching it is not carried out, nor retried."""
    remediator, _ = _remediator(Mode.OFF)
    result = remediator.execute(ACTION)
    assert (result.result, result.detail, result.retryable) == (Result.SKIPPED, "remediation is off", False)


def _ti(task_id: str, map_index: int = -1) -> TaskState:
    return TaskState(task_id, map_index, None)


@pytest.mark.parametrize(
    ("work", "said"),
    [
        (Work(Mode.FAIL, 1, (), (), fail_run=True), "run -> failed"),
        (Work(Mode.SKIP, 1, (), (_ti("extract"), _ti("load", 0)), fail_run=False), "skipped: extract, load[0]"),
        (
            Work(Mode.FAIL, 1, (_ti("extract"), _ti("t", 2)), (_ti("load"),), fail_run=True),
            "run -> failed; skipped: load; failed: extract, t[2]",
        ),
        (Work(Mode.SKIP, 1, (), (), fail_run=False), "note only"),
    ],
    ids=["run-only", "skip", "fail-all", "note-only"],
)
def test_a_writes_changes_are_named_in_order(work: Work, said: str) -> None:
    assert work.describe() == said


def test_now_utc_is_aware_utc() -> None:
    """The backends' commit time (``committed_at``), compared with Airflow's aware timestamps."""
    before = datetime.now(UTC)
    now = now_utc()
    assert now.tzinfo is UTC and before <= now <= datetime.now(UTC)


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (RuntimeError("first line\nsecond line"), "RuntimeError: first line"),
        (RuntimeError("\n  padded\nmore"), "RuntimeError: padded"),
        (TimeoutError(), "TimeoutError"),
        (RuntimeError(" \n "), "RuntimeError"),
    ],
    ids=["multi-line", "padded", "no-text", "blank-text"],
)
def test_a_backend_error_is_told_by_its_type_and_first_line(error: Exception, said: str) -> None:
    """The result's detail and the ``remediation`` line of an attempt that raised (a driver's error
    carries its SQL and a link on further lines: tests/integration/test_guarded_execute.py)."""
    assert _describe(error) == said


def test_a_run_deleted_or_created_anew_under_its_run_id_is_gone() -> None:
    """The re-read finds no run, or another run (another id) under the action's run_id: nothing is
    written to it, and the result says why."""
    recreated = RunState(ACTION.run.id + 100, ACTION.dag_id, ACTION.run.run_id, "queued", (_ti("extract"),))
    for current in (None, recreated):
        verdict = judge(ACTION, current, remediate_started=False)
        assert verdict == Verdict(Result.GONE, "the run no longer exists")


BOTH_RAN = "too late, both runs executed: tasks already started"
NONE_RAN = "too late: Airflow ended its tasks before any worker ran them"
BEAT = datetime(2026, 11, 30, 4, 10, 29, tzinfo=UTC)


@pytest.mark.parametrize(
    ("tasks", "said"),
    [
        ((TaskState("extract", -1, "running"),), f"{BOTH_RAN} (extract=running)"),
        ((TaskState("extract", -1, "failed", pid=42),), f"{BOTH_RAN} (extract=failed)"),
        ((TaskState("extract", -1, "failed", last_heartbeat_at=BEAT),), f"{BOTH_RAN} (extract=failed)"),
        ((TaskState("extract", -1, "queued", pid=42),), f"{BOTH_RAN} (extract=queued)"),  # back after a try
        ((TaskState("extract", -1, "scheduled", last_heartbeat_at=BEAT),), f"{BOTH_RAN} (extract=scheduled)"),
        ((TaskState("extract", -1, "up_for_retry"),), f"{NONE_RAN} (extract=up_for_retry)"),
        ((TaskState("extract", -1, "failed"),), f"{NONE_RAN} (extract=failed)"),
        (
            (TaskState("extract", 0, "failed"), TaskState("load", -1, "running", pid=7), _ti("report")),
            f"{BOTH_RAN} (extract[0]=failed, load=running)",
        ),
    ],
    ids=[
        "running-unmarked",
        "failed-pid",
        "failed-heartbeat",
        "queued-pid",
        "scheduled-heartbeat",
        "retry-unmarked",
        "failed-unmarked",
        "mixed",
    ],
)
def test_too_late_says_whether_a_worker_ran_the_tasks(tasks: tuple[TaskState, ...], said: str) -> None:
    """A worker stamps pid and heartbeat; a task Airflow failed (or set up for retry) while queued has
    neither: the duplicate is left alone either way, and the result tells which happened."""
    current = RunState(ACTION.run.id, ACTION.dag_id, ACTION.run.run_id, "running", tasks)
    assert judge(ACTION, current, remediate_started=False) == Verdict(Result.TOO_LATE, said)


def _judged(mode: Mode, state: str, *tasks: TaskState, remediate_started: bool = False) -> Verdict:
    current = RunState(ACTION.run.id, ACTION.dag_id, ACTION.run.run_id, state, tasks)
    return judge(replace(ACTION, mode=mode), current, remediate_started=remediate_started)


def test_a_run_with_nothing_left_to_stop_is_already_stopped_and_says_how() -> None:
    skipped, done = TaskState("extract", -1, "skipped"), TaskState("load", -1, "success", pid=3)
    assert _judged(Mode.FAIL, "failed", skipped) == Verdict(Result.ALREADY, "the run is already failed")
    every = "every task is already skipped"
    assert _judged(Mode.SKIP, "queued", skipped) == Verdict(Result.ALREADY, f"{every} (run state queued)")
    assert _judged(Mode.FAIL, "success", skipped) == Verdict(Result.ALREADY, f"{every} (run state success)")
    assert _judged(Mode.SKIP, "queued") == Verdict(Result.ALREADY, "no unfinished task left (run state queued)")
    assert _judged(Mode.SKIP, "running", skipped, done, remediate_started=True) == Verdict(
        Result.ALREADY, "no unfinished task left (run state running)"
    )
    assert _judged(Mode.FAIL, "success", skipped, done, remediate_started=True) == Verdict(
        Result.ALREADY, "the run already finished"
    )


def test_a_stop_half_landed_in_fail_mode_is_finished_by_failing_the_run() -> None:
    """Every task skipped, the run still queued (3.0.6-3.2.2's set-failed committed the skips only)."""
    skipped = TaskState("extract", -1, "skipped")
    work = Work(Mode.FAIL, ACTION.run.id, (), (), fail_run=True)
    assert _judged(Mode.FAIL, "queued", skipped) == Verdict(None, "run -> failed", work)

"""What the remediation dispatcher reports, attempt by attempt (issue 11 §3; issue 22 §8: the survivors
of ``detector/actions/remediation/dispatch.py`` under mutation, docs/mutation.md).

Every attempt's result reaches ``on_result`` (the alert, the ledger, the metrics) with ``final`` saying
whether more follow, and a retry is announced by one ``remediation_retry_scheduled`` line: both are
compared whole. The remediator is scripted (the dispatcher only routes its results); the back-offs are
short, and nothing here depends on how long anything took.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.dispatch import Job, Recheck, RemediationDispatcher
from detector.core.detect import find_duplicates
from detector.core.model import Finding
from detector.core.plan import Action, Mode, plan
from detector.core.ports import RemediationResult, Result
from detector.metrics import Metrics
from tests.factories import T0, run

Step = Callable[[Action], RemediationResult]
Report = tuple[Result, str, bool, bool]  # result, detail, final, retryable
LOGGER = "dupguard.remediation.dispatch"
Logs = list[MutableMapping[str, Any]]


def _job() -> Job:
    [finding] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({1}), 2: frozenset({1})}, {})
    [action] = plan([finding], Mode.FAIL, now=T0)
    return Job(finding, action)


def down(action: Action) -> RemediationResult:
    return RemediationResult(action, Result.FAILED, "down", retryable=True)


def stopped(action: Action) -> RemediationResult:
    return RemediationResult(action, Result.DONE, "stopped")


def crash(action: Action) -> RemediationResult:
    raise ValueError("bug")


class _Scripted:
    """Answers each ``execute`` with the next step of its script; records the actions it was given."""

    def __init__(self, *script: Step) -> None:
        self.script = list(script)
        self.actions: list[Action] = []

    def execute(self, action: Action) -> RemediationResult:
        self.actions.append(action)
        return self.script.pop(0)(action)

    def prepare(self) -> None: ...

    def close(self) -> None: ...


class _Rig:
    """A dispatcher (back-off 0.02 s doubling up to 0.05 s) and every report it made."""

    def __init__(
        self, remediator: _Scripted, recheck: Recheck | None = None, *, retry: bool = True, **options: Any
    ) -> None:
        self.reports: list[Report] = []
        self.finals = threading.Event()
        self.rechecks = 0
        self.recheck = recheck or (lambda job: (job.finding, job.action))
        self.metrics = Metrics()
        self.dispatcher = RemediationDispatcher(
            remediator,
            recheck=self._recheck,
            on_result=self._on_result,
            may_act=options.pop("may_act", lambda: True),
            metrics=self.metrics,
            retry_backoff=0.02,
            max_retry_backoff=0.05,
            retry=retry,
            **options,
        )

    def _recheck(self, job: Job) -> tuple[Finding, Action] | RemediationResult:
        self.rechecks += 1
        return self.recheck(job)

    def _on_result(self, job: Job, result: RemediationResult, final: bool) -> None:
        self.reports.append((result.result, result.detail, final, result.retryable))
        if final:
            self.finals.set()

    def run(self, job: Job) -> Job:
        assert self.dispatcher.submit(job)
        assert self.finals.wait(10), self.reports
        assert self.dispatcher.drain(10)
        return job

    def gauge(self, name: str) -> float | None:
        return self.metrics.registry.get_sample_value(name)


@pytest.fixture
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    with capture_logs() as captured:
        yield captured


def _retry_line(attempts: int, delay: float, error: str = "down") -> dict[str, Any]:
    job = _job()
    return {
        "event": "remediation_retry_scheduled",
        "log_level": "warning",
        "logger_name": LOGGER,
        "dag_id": job.action.dag_id,
        "run_id": job.action.run.run_id,
        "attempts": attempts,
        "retry_in_seconds": delay,
        "error": error,
    }


def _lines(logs: Logs, event: str) -> Logs:
    return [e for e in logs if e["event"] == event]


def test_each_failed_attempt_is_reported_with_its_count_then_the_final_result(logs: Logs) -> None:
    """Three failures then a stop: each failure is reported not final, retryable, saying which attempt
    it was; the back-off doubles up to its cap; the group is judged again before every retry."""
    remediator = _Scripted(down, down, down, stopped)
    rig = _Rig(remediator)
    job = rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [
        (Result.FAILED, "down (attempt 1; retrying in 0 s)", False, True),
        (Result.FAILED, "down (attempt 2; retrying in 0 s)", False, True),
        (Result.FAILED, "down (attempt 3; retrying in 0 s)", False, True),
        (Result.DONE, "stopped", True, False),
    ]
    assert [(r.result, r.detail) for r in job.results] == [(r[0], r[1]) for r in rig.reports]
    assert _lines(logs, "remediation_retry_scheduled") == [
        _retry_line(1, 0.02),
        _retry_line(2, 0.04),
        _retry_line(3, 0.05),
    ]
    assert (job.attempts, rig.rechecks, len(remediator.actions)) == (4, 3, 4)
    assert rig.dispatcher.idle() and rig.dispatcher.retries_pending() == 0
    assert _lines(logs, "remediations_not_finished_at_shutdown") == []


def test_without_retries_the_first_failure_is_final_and_not_retryable(logs: Logs) -> None:
    """``run --once``: a failed attempt is the final result, as the remediator said it."""
    remediator = _Scripted(down)
    rig = _Rig(remediator, retry=False)
    rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [(Result.FAILED, "down", True, False)]
    assert _lines(logs, "remediation_retry_scheduled") == []


def test_a_rejudgement_that_settles_the_run_is_its_final_result() -> None:
    settled = RemediationResult(_job().action, Result.ALREADY, "its note says dupguard already stopped it")
    remediator = _Scripted(down)
    rig = _Rig(remediator, lambda job: settled)
    rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [
        (Result.FAILED, "down (attempt 1; retrying in 0 s)", False, True),
        (Result.ALREADY, "its note says dupguard already stopped it", True, False),
    ]
    assert len(remediator.actions) == 1


def test_a_retry_acts_on_what_the_rejudgement_hands_back() -> None:
    first = _job()
    planned = first.action
    [finding] = find_duplicates([run(id=1), run(id=2), run(id=3)], {n: frozenset({1}) for n in (1, 2, 3)}, {})
    now = plan([finding], Mode.FAIL, now=T0)[-1]
    remediator = _Scripted(down, stopped)
    rig = _Rig(remediator, lambda job: (finding, now))
    job = rig.run(first)
    rig.dispatcher.close()
    assert remediator.actions == [planned, now] and planned != now
    assert (job.finding, job.action) == (finding, now)


def test_a_failed_rejudgement_is_reported_and_tried_again(logs: Logs) -> None:
    """The database is down when the group is judged again: reported (not final), the judgement is
    tried again later, and no write is made on the stale judgement meanwhile."""
    failures = [RuntimeError("database down")]

    def recheck(job: Job) -> tuple[Finding, Action]:
        if failures:
            raise failures.pop()
        return job.finding, job.action

    remediator = _Scripted(down, stopped)
    rig = _Rig(remediator, recheck)
    rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [
        (Result.FAILED, "down (attempt 1; retrying in 0 s)", False, True),
        (Result.FAILED, "re-judgement failed: RuntimeError: database down (attempt 1; retrying in 0 s)", False, True),
        (Result.DONE, "stopped", True, False),
    ]
    assert _lines(logs, "remediation_retry_scheduled") == [
        _retry_line(1, 0.02),
        _retry_line(1, 0.02, "re-judgement failed: RuntimeError: database down"),
    ]
    assert len(remediator.actions) == 2


def test_a_remediator_that_raises_costs_the_job_one_attempt_not_its_worker(logs: Logs) -> None:
    remediator = _Scripted(crash, stopped)
    rig = _Rig(remediator, workers=1)
    job = rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [
        (Result.FAILED, "internal error (logged) (attempt 1; retrying in 0 s)", False, True),
        (Result.DONE, "stopped", True, False),
    ]
    [crashed] = _lines(logs, "remediation_worker_crashed")
    assert crashed == {
        "event": "remediation_worker_crashed",
        "log_level": "error",
        "logger_name": LOGGER,
        "exc_info": True,
        "run_id": job.action.run.run_id,
    }


def test_a_report_that_raises_loses_neither_the_job_nor_the_next_report(logs: Logs) -> None:
    """The alert or the ledger failing on a report: logged, and the job still ends (``idle``)."""
    reports: list[tuple[str, bool]] = []

    def on_result(job: Job, result: RemediationResult, final: bool) -> None:
        reports.append((result.detail, final))
        raise OSError("ledger down")

    job = _job()
    dispatcher = RemediationDispatcher(
        _Scripted(down, stopped),
        recheck=lambda j: (j.finding, j.action),
        on_result=on_result,
        may_act=lambda: True,
        retry_backoff=0.02,
    )
    try:
        assert dispatcher.submit(job)
        assert dispatcher.drain(10)
    finally:
        dispatcher.close()
    assert reports == [("down (attempt 1; retrying in 0 s)", False), ("stopped", True)]
    failed = {
        "event": "remediation_report_failed",
        "log_level": "error",
        "logger_name": LOGGER,
        "exc_info": True,
        "run_id": job.action.run.run_id,
    }
    assert _lines(logs, "remediation_report_failed") == [failed, failed]
    assert [r.detail for r in job.results] == ["down (attempt 1; retrying in 0 s)", "stopped"]


def test_a_job_submitted_while_not_leading_waits_then_is_rejudged_before_it_acts(logs: Logs) -> None:
    leading = threading.Event()
    remediator = _Scripted(stopped)
    rig = _Rig(remediator, may_act=leading.is_set)
    assert rig.dispatcher.submit(_job())
    waited = threading.Event()

    def lead() -> None:  # once the job waits for leadership (a retry pending), this replica leads again
        while rig.dispatcher.retries_pending() == 0 and not rig.finals.is_set():
            waited.wait(0.01)
        leading.set()

    threading.Thread(target=lead, daemon=True).start()
    assert rig.finals.wait(10)
    rig.dispatcher.close()
    assert rig.reports == [(Result.DONE, "stopped", True, False)]
    assert (rig.rechecks, len(remediator.actions)) == (1, 1)
    assert _lines(logs, "remediation_retry_scheduled") == []


def test_a_write_refused_by_the_fence_is_logged_as_waiting_for_leadership(logs: Logs) -> None:
    leading = threading.Event()
    leading.set()

    def refused(action: Action) -> RemediationResult:
        leading.clear()  # the lease ended during the attempt
        threading.Timer(0.05, leading.set).start()
        return RemediationResult(action, Result.FAILED, "not written: lease ended", retryable=True)

    rig = _Rig(_Scripted(refused, stopped), may_act=leading.is_set)
    job = rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [(Result.DONE, "stopped", True, False)]
    assert _lines(logs, "remediation_waits_for_leadership") == [
        {
            "event": "remediation_waits_for_leadership",
            "log_level": "info",
            "logger_name": LOGGER,
            "run_id": job.action.run.run_id,
            "detail": "not written: lease ended",
        }
    ]
    assert rig.rechecks == 1 and job.attempts == 2


def test_a_full_queue_refuses_the_job_and_shutdown_counts_what_was_left(logs: Logs) -> None:
    """No worker free (none here): the queue holds ``queue_size`` jobs and refuses the next one; the
    depth is a gauge; ``drain`` gives up at its timeout; ``close`` names how many were left."""
    rig = _Rig(_Scripted(), workers=0, queue_size=2)
    assert rig.dispatcher.submit(_job()) and rig.dispatcher.submit(_job())
    assert not rig.dispatcher.submit(_job())
    assert rig.gauge("dupguard_remediation_queue_depth") == 2.0
    assert rig.gauge("dupguard_remediation_retries_pending") == 0.0
    assert not rig.dispatcher.idle()
    assert not rig.dispatcher.drain(0.05)
    rig.dispatcher.close()
    assert _lines(logs, "remediations_not_finished_at_shutdown") == [
        {"event": "remediations_not_finished_at_shutdown", "log_level": "warning", "logger_name": LOGGER, "count": 2}
    ]
    assert rig.reports == []

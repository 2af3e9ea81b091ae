"""What the remediation dispatcher reports, attempt by attempt (the survivors
of ``detector/actions/remediation/dispatch.py`` under mutation, benchmarks/results/mutation.md).

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

    def record(self, result: RemediationResult) -> None: ...

    def close(self) -> None: ...


class _Rig:
    """A dispatcher (back-off 0.02 s doubling up to 0.05 s) and every report it made."""

    def __init__(
        self,
        remediator: _Scripted,
        recheck: Recheck | None = None,
        *,
        retry: bool = True,
        backoff: tuple[float, float] = (0.02, 0.05),
        **options: Any,
    ) -> None:
        self.reports: list[Report] = []
        self.reported_jobs: list[Job] = []  # the daemon's on_result reads the job's group and run
        self.reported = threading.Event()
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
            retry_backoff=backoff[0],
            max_retry_backoff=backoff[1],
            retry=retry,
            **options,
        )

    def _recheck(self, job: Job) -> tuple[Finding, Action] | RemediationResult:
        self.rechecks += 1
        return self.recheck(job)

    def _on_result(self, job: Job, result: RemediationResult, final: bool) -> None:
        self.reports.append((result.result, result.detail, final, result.retryable))
        self.reported_jobs.append(job)
        self.reported.set()
        if final:
            self.finals.set()

    def run(self, job: Job) -> Job:
        assert self.dispatcher.submit(job)
        assert self.finals.wait(10), self.reports
        assert self.dispatcher.drain(10)
        assert self.reported_jobs and all(j is job for j in self.reported_jobs)
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
    rig = _Rig(remediator, backoff=(0.125, 0.3))
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
        _retry_line(1, 0.12),  # 0.125 s, to the hundredth
        _retry_line(2, 0.25),
        _retry_line(3, 0.3),  # the cap
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
    job = rig.run(_job())
    rig.dispatcher.close()
    assert {r.action for r in job.results} == {job.action}  # the alert names the run of each result
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
    assert {r.action for r in job.results} == {job.action}
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


class _Frozen:
    """The dispatcher's clock, moved by the test only: a job waiting for its back-off becomes due exactly
    when the test says so, however slow the machine."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("condition not reached in 10 s")


def test_a_job_submitted_while_not_leading_waits_one_back_off_then_is_rejudged(logs: Logs) -> None:
    """Not leading: no attempt; the job is asked again after the first back-off (0.02 s on the dispatcher's
    clock, and not before), and judged again from the database before it acts."""
    clock, leading = _Frozen(), threading.Event()
    remediator = _Scripted(stopped)
    rig = _Rig(remediator, may_act=leading.is_set, clock=clock)
    assert rig.dispatcher.submit(_job())
    _until(lambda: rig.dispatcher.retries_pending() == 1)
    leading.set()
    clock.now = 100.0 + 0.02
    assert rig.finals.wait(10), "not retried once its back-off ended"
    rig.dispatcher.close()
    assert rig.reports == [(Result.DONE, "stopped", True, False)]
    assert (rig.rechecks, len(remediator.actions)) == (1, 1)
    assert _lines(logs, "remediation_retry_scheduled") == []


@pytest.mark.parametrize("origin", [100.0, -1.0])  # a monotonic clock's zero is arbitrary
def test_a_retry_is_made_when_its_back_off_ends_on_the_dispatchers_clock(origin: float) -> None:
    clock = _Frozen()
    clock.now = origin
    calls_at: list[float] = []

    def at(step: Step) -> Step:
        def timed(action: Action) -> RemediationResult:
            calls_at.append(clock.now)
            return step(action)

        return timed

    rig = _Rig(_Scripted(at(down), at(stopped)), clock=clock)
    assert rig.dispatcher.submit(_job())
    assert rig.reported.wait(10)
    clock.now = origin + 0.02  # the logged back-off of the first attempt
    assert rig.finals.wait(10), "not retried once its back-off ended"
    rig.dispatcher.close()
    assert calls_at == [origin, origin + 0.02]


def test_a_picked_up_job_is_rejudged_before_its_first_attempt() -> None:
    """Handed over from an earlier leader's ledger: that leader may have acted since it was planned."""
    remediator = _Scripted(stopped)
    rig = _Rig(remediator)
    job = _job()
    rig.run(Job(job.finding, job.action, picked_up=True))
    rig.dispatcher.close()
    assert (rig.rechecks, rig.reports) == (1, [(Result.DONE, "stopped", True, False)])


def test_a_stop_that_landed_as_the_lease_ended_is_final() -> None:
    """Only a retryable failure can be the fence's doing; a stop that committed is the result."""
    leading = threading.Event()
    leading.set()

    def lands(action: Action) -> RemediationResult:
        leading.clear()
        return stopped(action)

    rig = _Rig(_Scripted(lands), may_act=leading.is_set)
    rig.run(_job())
    rig.dispatcher.close()
    assert rig.reports == [(Result.DONE, "stopped", True, False)]


class _Blocking:
    """A first step that blocks until released (a write in flight)."""

    def __init__(self, then: Step) -> None:
        self.entered, self.release, self.then = threading.Event(), threading.Event(), then

    def __call__(self, action: Action) -> RemediationResult:
        self.entered.set()
        self.release.wait(30)
        return self.then(action)


def test_two_jobs_in_flight_at_once_both_end_and_the_dispatcher_is_idle() -> None:
    first = _Blocking(stopped)
    rig = _Rig(_Scripted(first, stopped), workers=1)
    assert rig.dispatcher.submit(_job())
    assert first.entered.wait(10)
    assert rig.dispatcher.submit(_job())
    first.release.set()
    assert rig.dispatcher.drain(10)
    rig.dispatcher.close()
    assert rig.reports == [(Result.DONE, "stopped", True, False)] * 2


def test_shutdown_waits_for_the_attempt_in_flight_reports_it_final_and_drops_the_queued_job(logs: Logs) -> None:
    """``close``: the write in flight finishes and is reported final, still retryable: shutdown ended the
    job, not the action, so the durable ledger keeps it pending for the next leader (a restarted leader
    once left a duplicate unstopped: its failed attempt was final, its pending entry dropped); the job
    still queued is never attempted and is counted as not finished."""
    first = _Blocking(down)
    remediator = _Scripted(first, stopped)
    rig = _Rig(remediator, workers=1)
    job = _job()
    assert rig.dispatcher.submit(job)
    assert first.entered.wait(10)
    assert rig.dispatcher.submit(_job())

    # let the write finish only once shutdown has begun (white box: close sets this first)
    def release_once_stopping() -> None:
        if rig.dispatcher._stopping.wait(10):
            first.release.set()

    threading.Thread(target=release_once_stopping, daemon=True).start()
    rig.dispatcher.close(timeout=10)
    assert rig.reports == [(Result.FAILED, "down", True, True)]
    assert remediator.actions == [job.action]
    assert _lines(logs, "remediations_not_finished_at_shutdown") == [
        {"event": "remediations_not_finished_at_shutdown", "log_level": "warning", "logger_name": LOGGER, "count": 1}
    ]


def test_shutdown_does_not_wait_past_its_timeout_for_a_hung_attempt() -> None:
    hung = _Blocking(stopped)
    rig = _Rig(_Scripted(hung), workers=1)
    assert rig.dispatcher.submit(_job())
    assert hung.entered.wait(10)
    threading.Timer(5.0, hung.release.set).start()  # should close wait for it, the test fails instead of hanging
    rig.dispatcher.close(timeout=0.1)
    assert not hung.release.is_set(), "close returned only once the hung attempt was let go"
    hung.release.set()


def test_the_dispatchers_threads_are_daemons_named_for_a_thread_dump() -> None:
    """A worker stuck in a hung call must not keep the process alive after ``close`` gave up on it, and a
    thread dump (py-spy, faulthandler) names what each thread is."""
    before = set(threading.enumerate())
    rig = _Rig(_Scripted(), workers=2)
    started = [t for t in threading.enumerate() if t not in before]
    rig.dispatcher.close()
    assert sorted((t.name, t.daemon) for t in started) == [
        ("dupguard-remediate-0", True),
        ("dupguard-remediate-1", True),
        ("dupguard-retry", True),
    ]


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


def test_a_failed_rejudgement_after_waiting_for_leadership_is_judged_again_before_any_write() -> None:
    """Submitted while another replica led, the job must be judged again from the database before it
    acts. That judgement fails once (the database is down): the next try judges again, it does not
    act on the plan made before the wait. Here the second judgement finds the run settled."""
    leading = threading.Event()
    settled = RemediationResult(_job().action, Result.ALREADY, "its note says dupguard already stopped it")
    answers: list[Exception | RemediationResult] = [RuntimeError("database down"), settled]

    def recheck(job: Job) -> RemediationResult:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    remediator = _Scripted(stopped)
    rig = _Rig(remediator, recheck, may_act=leading.is_set)
    assert rig.dispatcher.submit(_job())
    threading.Timer(0.05, leading.set).start()
    assert rig.finals.wait(10)
    rig.dispatcher.close()
    assert rig.reports == [
        (Result.FAILED, "re-judgement failed: RuntimeError: database down (attempt 0; retrying in 0 s)", False, True),
        (Result.ALREADY, "its note says dupguard already stopped it", True, False),
    ]
    assert (rig.rechecks, remediator.actions) == (2, [])


def test_a_retry_due_while_the_queue_is_full_waits_for_room_and_is_not_lost() -> None:
    """One worker busy, the queue (size 1) full: the retry that comes due keeps waiting for room (every
    0.5 s it looks again, so a shutdown is seen) and runs once the queue drains."""
    clock = _Frozen()
    busy = _Blocking(stopped)
    remediator = _Scripted(down, busy, stopped, stopped)
    rig = _Rig(remediator, workers=1, queue_size=1, clock=clock)
    retried = _job()
    assert rig.dispatcher.submit(retried)
    assert rig.reported.wait(10)  # its first attempt failed: a retry is due at 100.02
    assert rig.dispatcher.submit(_job())
    assert busy.entered.wait(10)  # the worker is busy
    assert rig.dispatcher.submit(_job())  # the queue is full
    clock.now = 100.0 + 0.02
    _until(lambda: rig.dispatcher.retries_pending() == 0)  # taken out of the back-off, waiting for room
    threading.Event().wait(0.6)  # long enough for the retry's first wait for room (0.5 s) to end
    busy.release.set()
    assert rig.dispatcher.drain(10), rig.reports
    rig.dispatcher.close()
    assert [r for r in rig.reports if r[2]] == [(Result.DONE, "stopped", True, False)] * 3
    assert [r.result for r in retried.results] == [Result.FAILED, Result.DONE]

"""The write side of fencing: a write is sent only while the leader's fence is valid, its
timeout clipped to the lease left; a refused write is neither ``failed`` nor ``done`` (the job waits
for leadership) and the job is re-judged before it acts again."""

from __future__ import annotations

import threading

import pytest

from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.dispatch import Job, RemediationDispatcher
from detector.airflowapi.session import Session
from detector.config import Config
from detector.core.detect import find_duplicates
from detector.core.fence import Fence, LeadershipLost
from detector.core.model import Finding
from detector.core.plan import Action, Mode, plan
from detector.core.ports import RemediationResult, Result
from tests.factories import T0, run


def _job() -> Job:
    [finding] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({1}), 2: frozenset({1})}, {})
    [action] = plan([finding], Mode.FAIL, now=T0)
    return Job(finding, action)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_fence_is_valid_until_its_lease_ends() -> None:
    clock = _Clock()
    fence = Fence(term=3, ends=101.5, clock=clock)
    assert fence.valid() and fence.remaining() == pytest.approx(1.5)
    clock.now = 101.5
    assert not fence.valid() and fence.remaining() == 0.0


def _backend(fence: Fence | None) -> ApiBackend:
    config = Config.of(database_url="sqlite://", airflow_api_url="http://127.0.0.1:9", airflow_token="t")
    return ApiBackend(Session.from_config(config), states=object(), fence=lambda: fence)  # type: ignore[arg-type]


def test_the_api_backend_clips_each_write_to_the_lease_left_and_refuses_without_a_fence() -> None:
    clock = _Clock()
    backend = _backend(Fence(term=1, ends=100.8, clock=clock))
    assert backend.write_timeout() == pytest.approx(0.8)  # the call timeout is 5 s: the lease is shorter
    clock.now = 100.8
    with pytest.raises(LeadershipLost):
        backend.write_timeout()
    with pytest.raises(LeadershipLost):
        _backend(None).write_timeout()
    assert _backend(Fence(term=1, ends=1e9, clock=clock)).write_timeout() == 5.0


class _Fenced:
    """The first write is refused by the fence (and the lease ends meanwhile); then it is stopped."""

    def __init__(self, leading: threading.Event) -> None:
        self.leading, self.calls = leading, 0

    def execute(self, action: Action) -> RemediationResult:
        self.calls += 1
        if self.calls == 1:
            self.leading.clear()
            return RemediationResult(action, Result.FAILED, "not written: lease ended", retryable=True)
        return RemediationResult(action, Result.DONE, "stopped")

    def prepare(self) -> None: ...

    def record(self, result: RemediationResult) -> None: ...

    def close(self) -> None: ...


def test_a_write_refused_by_the_fence_waits_for_leadership_then_is_rejudged() -> None:
    """The fence ends during the attempt: nothing is reported (neither failed nor done); the job waits
    while the replica does not lead, and is judged again from the database before it acts again."""
    leading = threading.Event()
    leading.set()
    results: list[tuple[Result, bool]] = []
    rejudged: list[Job] = []
    done = threading.Event()
    backend = _Fenced(leading)

    def recheck(job: Job) -> tuple[Finding, Action]:
        rejudged.append(job)
        return job.finding, job.action

    def on_result(job: Job, result: RemediationResult, final: bool) -> None:
        results.append((result.result, final))
        if final:
            done.set()

    dispatcher = RemediationDispatcher(
        backend, recheck=recheck, on_result=on_result, may_act=leading.is_set, retry_backoff=0.02
    )
    try:
        assert dispatcher.submit(_job())
        threading.Timer(0.3, leading.set).start()  # leads again (after its takeover wait)
        assert done.wait(10)
    finally:
        dispatcher.close()
    assert results == [(Result.DONE, True)], "the refused attempt is no result"
    assert len(rejudged) == 1 and backend.calls == 2


def test_a_leader_waiting_to_act_is_up_and_says_so() -> None:
    """The takeover wait is its own state (dupguard_state, /readyz): up, since it detects and alerts."""
    from detector.app.status import State, evaluate

    status = evaluate(db_error=None, leader=True, poll_error=None, lock=None, waiting=2.5)
    assert status.state is State.WAITING_TO_ACT and status.up and "2.5 s" in status.reason
    assert evaluate(db_error=None, leader=True, poll_error=None, lock=None).state is State.LEADING

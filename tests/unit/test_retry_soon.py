"""A remediation that failed because the Airflow API refused the connection (nothing reached it) is
retried at the shortest back-off, not a doubling one: when the API returns, the duplicate must be
stopped before its worker's own retry starts the task (the miss traced in benchmarks/results/e2e.md). A failure
that did reach the server (timeout, 5xx) keeps the doubling back-off."""

from __future__ import annotations

import socket
import threading
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.dispatch import Job, RemediationDispatcher
from detector.airflowapi.client import Transient
from detector.airflowapi.session import Session
from detector.config import Config
from detector.core.detect import find_duplicates
from detector.core.plan import Action, Mode, plan
from detector.core.ports import RemediationResult, Result
from tests.factories import T0, run


def _job() -> Job:
    [finding] = find_duplicates([run(id=1), run(id=2)], {1: frozenset({1}), 2: frozenset({1})}, {})
    [action] = plan([finding], Mode.FAIL, now=T0)
    return Job(finding, action)


class _Failing:
    """Fails ``times`` times (as the api backend reports it), then stops the duplicate."""

    def __init__(self, times: int, *, soon: bool) -> None:
        self.times, self.soon, self.calls = times, soon, 0

    def execute(self, action: Action) -> RemediationResult:
        self.calls += 1
        if self.calls <= self.times:
            return RemediationResult(action, Result.FAILED, "down", retryable=True, retry_soon=self.soon)
        return RemediationResult(action, Result.DONE, "stopped")

    def prepare(self) -> None: ...

    def record(self, result: RemediationResult) -> None: ...

    def close(self) -> None: ...


def _delays(soon: bool) -> list[float]:
    done = threading.Event()
    job = _job()

    def on_result(j: Job, result: RemediationResult, final: bool) -> None:
        if final:
            done.set()

    with capture_logs() as logs:
        dispatcher = RemediationDispatcher(
            _Failing(4, soon=soon),
            recheck=lambda j: (j.finding, j.action),
            on_result=on_result,
            may_act=lambda: True,
            retry_backoff=0.02,
            max_retry_backoff=10.0,
        )
        try:
            assert dispatcher.submit(job)
            assert done.wait(10)
        finally:
            dispatcher.close()
    assert job.results[-1].result is Result.DONE
    return [e["retry_in_seconds"] for e in logs if e["event"] == "remediation_retry_scheduled"]


def test_refused_connections_are_retried_at_the_first_back_off() -> None:
    assert _delays(soon=True) == [0.02, 0.02, 0.02, 0.02]


def test_failures_that_reached_the_server_back_off_doubling() -> None:
    assert _delays(soon=False) == [0.02, 0.04, 0.08, 0.16]


def test_a_refused_connection_is_told_from_one_that_reached_the_server() -> None:
    """A real refused TCP connection (a closed port) is ``refused``; a server that accepts and never
    answers (a timeout) is not."""
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    hanging = socket.socket()
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    try:
        for url, expected in (
            (f"http://127.0.0.1:{port}", True),
            (f"http://127.0.0.1:{hanging.getsockname()[1]}", False),
        ):
            config = Config.of(airflow_api_url=url, airflow_token="t", airflow_timeout=timedelta(milliseconds=300))
            session = Session.from_config(config)
            with pytest.raises(Transient) as caught:
                session.request("GET", "/api/v2/version", needs="nothing")
            assert caught.value.refused is expected, url
            session.close()
    finally:
        hanging.close()

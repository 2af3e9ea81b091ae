"""Backend ``api`` under mutation (benchmarks/results/mutation.md): what its results, retries and log
lines say, pinned whole, against a real Airflow 3.1.2 API server.

The paths test_remediation_api.py reaches only in part: a run stopped by someone else while our
attempt failed (whose note, if any, is named), a write that conflicted with another writer's, the
back-off between attempts, the ``remediation_retry`` line, the final failure's text. Every test
checks the database too: what the result says happened is what Airflow recorded.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import GuardedRemediator
from detector.actions.remediation.readback import NO_START_DATE
from detector.airflowapi.permissions import EDIT_RUNS, EDIT_TASK_INSTANCES
from detector.app.wiring import api_reader, build_remediator
from detector.config import Config
from detector.core.fence import Fence
from detector.core.plan import Action, Mode
from detector.core.ports import Result, StartedTask
from detector.metrics import Metrics
from detector.sources.api.reader import ApiRunStates
from tests.airflow_server import (
    AirflowServer,
    CountingProxy,
    ServerPool,
    db_state,
    sql,
    start_task,
    warm_execution_api,
)
from tests.integration.test_remediation_api import FANOUT, JWT_LIFETIME, STARTED, Harness

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

RUNS = "/api/v2/dags/"
PARTITIONED = "race_partitioned"  # 3.2.2: a duplicate pair for one partition key, nothing started
INJECTED = "injected by CountingProxy"  # the proxy's 5xx body, as the session reports its detail


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    # test_remediation_api's server settings: one server serves both files (and a held one, tests/airflow_hold.py)
    return airflow_servers.get("3.1.2", [FANOUT, STARTED], jwt_expiration=JWT_LIFETIME)


@pytest.fixture(scope="module")
def af322(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.2.2", [PARTITIONED])


@pytest.fixture
def h(af312: AirflowServer) -> Iterator[Harness]:
    harness = Harness(af312, af312.reset(FANOUT))
    yield harness
    harness.close()


def _remediator(
    h: Harness, url: str, *, mode: Mode = Mode.FAIL, user: str = "admin", timeout: float = 30.0, **options: Any
) -> GuardedRemediator:
    """A remediator whose backend gets ``options`` (sleep, attempts, back-off) as given."""
    settings = Config.of(
        database_url=h.url,
        remediation=mode.value,
        remediation_backend="api",
        airflow_api_url=url,
        airflow_username=user,
        airflow_password=user,
        airflow_timeout=timedelta(seconds=timeout),
    )
    remediator = build_remediator(settings, h.engine, h.db.tables, Metrics(), **options)
    assert isinstance(remediator, GuardedRemediator) and isinstance(remediator.backend, ApiBackend)
    h.made.append(remediator)
    return remediator


def _stop_by_hand(h: Harness, action: Action, note: str | None) -> None:
    """What an operator does in the UI: the run failed, optionally with a note of theirs."""
    sql(h.url, "UPDATE dag_run SET state='failed', end_date=now() WHERE run_id=:r", r=action.run.run_id)
    if note is not None:
        sql(
            h.url,
            "INSERT INTO dag_run_note (dag_run_id, content, user_id, created_at, updated_at) "
            "SELECT id, :n, 'operator', now(), now() FROM dag_run WHERE run_id=:r",
            n=note,
            r=action.run.run_id,
        )


def _patch_failed(status: int) -> str:
    return f"PATCH dagRun state=failed: HTTP {status} {INJECTED}"


@pytest.mark.parametrize(
    ("note", "who"),
    [
        ("stopped by hand: bad data", "its note says 'stopped by hand: bad data'"),
        ("x" * 300, f"its note says {'x' * 200!r}"),
        (None, "it has no note (an operator, Airflow or another writer)"),
    ],
    ids=["note", "long-note", "no-note"],
)
def test_a_run_stopped_by_someone_else_during_a_failed_attempt_is_already_and_says_whose_note(
    h: Harness, note: str | None, who: str
) -> None:
    """Our PATCH fails (503) while an operator fails the run: ``already``, not ``done``, naming the
    operator's note (its first 200 characters) or its absence; the run stays as the operator left it."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(("PATCH " + RUNS, lambda: _stop_by_hand(h, action, note)))
        proxy.inject.append((RUNS, 503, 0.0))
        result = _remediator(h, proxy.url, backoff=0.0).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.ALREADY
    assert result.detail == (
        f"the run is already failed (after a failed attempt: {_patch_failed(503)}); "
        f"not stopped by dupguard's write: {who}"
    )
    assert patches == 1
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.note == note
    assert {ti[0] for ti in row.tasks.values()} == {None}  # Airflow's set-failed never ran: ours did not land


def test_a_write_that_conflicted_with_another_writers_is_already(h: Harness) -> None:
    """409 (another replica's write won) and the run is found stopped: ``already``, saying ours conflicted."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(("PATCH " + RUNS, lambda: _stop_by_hand(h, action, "another writer")))
        proxy.inject.append((RUNS, 409, 0.0))
        result = _remediator(h, proxy.url, backoff=0.0).execute(action)
    assert result.result is Result.ALREADY
    assert result.detail == f"the run is already failed (our write conflicted: {_patch_failed(409)})"
    assert db_state(h.url)[action.run.run_id].note == "another writer"


def test_the_back_off_doubles_up_to_its_cap_and_the_final_failure_says_how_often(h: Harness) -> None:
    """Four attempts against a server answering 503: sleeps 0.2, 0.4, then capped at 0.5; each retry
    logged with its attempt and error; the result names the URL, the count and the last error, and is
    not retried soon (the request reached a server)."""
    action = h.actions(Mode.FAIL)[0]
    slept: list[float] = []
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [(RUNS, 503, 0.0)] * 4  # the PATCHes only: the token request gets through
        remediator = _remediator(h, proxy.url, attempts=4, backoff=0.2, max_backoff=0.5, sleep=slept.append)
        with capture_logs() as logs:
            result = remediator.execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    error = f"PATCH dagRun state=failed: HTTP 503 {INJECTED}"
    assert slept == [0.2, 0.4, 0.5]
    assert patches == 4
    retries = [e for e in logs if e["event"] == "remediation_retry"]
    assert retries == [
        {
            "event": "remediation_retry",
            "log_level": "info",
            "logger_name": "dupguard.remediation.api",
            "dag_id": action.dag_id,
            "run_id": action.run.run_id,
            "attempt": n,
            "error": error,
        }
        for n in (1, 2, 3)
    ]
    assert result.result is Result.FAILED
    assert result.detail == f"Airflow API at {proxy.url} failed 4 times: {error}"
    assert result.retryable and not result.retry_soon
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "queued" and row.note is None


def test_no_attempts_configured_still_makes_one(h: Harness) -> None:
    """attempts=0 is read as one attempt, not none: the run is stopped."""
    action = h.actions(Mode.FAIL)[0]
    result = _remediator(h, h.server.url, attempts=0).execute(action)
    assert result.result is Result.DONE, result.detail
    assert db_state(h.url)[action.run.run_id].state == "failed"


# --- a token just issued and refused: one token request per action, on every call of it ----------------


def test_a_token_just_issued_and_refused_fails_the_action_without_a_second_token_request(h: Harness) -> None:
    """The retried PATCH is answered 401 with the token this action fetched for its first attempt
    (api-servers that do not share jwt_secret): FAILED saying so, with one token request for the whole
    action, its retries included, and nothing written."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [(RUNS, 503, 0.0), (RUNS, 401, 0.0)]
        result = _remediator(h, proxy.url, backoff=0.0).execute(action)
        tokens = proxy.count("POST", "/auth/token")
    assert result.result is Result.FAILED
    assert result.detail == (
        f"a token just issued by {proxy.url}/auth/token was rejected: check that every api-server shares "
        "[api_auth] jwt_secret, jwt_issuer and jwt_audience"
    )
    assert tokens == 1
    assert db_state(h.url)[action.run.run_id].state == "queued"


# --- skip on 3.2: the bulk task-instance call -------------------------------------------------------


@pytest.fixture
def h322(af322: AirflowServer) -> Iterator[Harness]:
    harness = Harness(af322, af322.reset(PARTITIONED))
    yield harness
    harness.close()


def test_a_bulk_skip_that_keeps_failing_names_the_call_and_writes_nothing(h322: Harness) -> None:
    (action,) = h322.actions(Mode.SKIP)
    before = db_state(h322.url)
    with CountingProxy(h322.server.port) as proxy:
        proxy.inject += [(RUNS, 503, 0.0)] * 2
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, attempts=2, backoff=0.0).execute(action)
    assert result.result is Result.FAILED
    assert result.detail == (
        f"Airflow API at {proxy.url} failed 2 times: PATCH taskInstances (bulk skip): HTTP 503 {INJECTED}"
    )
    assert db_state(h322.url) == before


def test_a_user_who_may_not_edit_task_instances_gets_a_403_naming_that_permission(h322: Harness) -> None:
    (action,) = h322.actions(Mode.SKIP)
    before = db_state(h322.url)
    result = _remediator(h322, h322.server.url, mode=Mode.SKIP, user="viewer").execute(action)
    assert result.result is Result.FAILED
    assert result.detail == (
        f"PATCH taskInstances (bulk skip): HTTP 403 Forbidden: the Airflow user needs {EDIT_TASK_INSTANCES}"
    )
    assert db_state(h322.url) == before


def test_a_task_instance_deleted_before_the_bulk_skip_makes_the_run_gone(h322: Harness) -> None:
    """Airflow reports the missing task instance in the bulk answer's errors (HTTP 200): GONE, not done."""
    (action,) = h322.actions(Mode.SKIP)
    delete = "DELETE FROM task_instance WHERE run_id=:r"
    with CountingProxy(h322.server.port) as proxy:
        proxy.hooks.append(("PATCH " + RUNS, lambda: sql(h322.url, delete, r=action.run.run_id)))
        result = _remediator(h322, proxy.url, mode=Mode.SKIP).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.GONE
    ids = [
        {"dag_id": action.dag_id, "dag_run_id": action.run.run_id, "task_id": task, "map_index": -1}
        for task in ("load", "extract")
    ]
    named = [repr(ids), repr(ids[::-1])]  # Airflow's order of the missing ones is not ours
    assert result.detail in [
        "HTTP 404 from the Airflow API: bulk skip: "
        + repr([{"error": f"The task instances with these identifiers: {n} were not found", "status_code": 404}])
        for n in named
    ], result.detail
    assert patches == 1
    assert db_state(h322.url)[action.run.run_id].note is None


def test_a_token_just_issued_and_refused_at_the_bulk_skip_fails_without_a_second_request(h322: Harness) -> None:
    (action,) = h322.actions(Mode.SKIP)
    before = db_state(h322.url)
    with CountingProxy(h322.server.port) as proxy:
        proxy.inject += [(RUNS, 503, 0.0), (RUNS, 401, 0.0)]
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, backoff=0.0).execute(action)
        tokens = proxy.count("POST", "/auth/token")
    assert result.result is Result.FAILED and result.detail.startswith("a token just issued by "), result.detail
    assert tokens == 1
    assert db_state(h322.url) == before


def test_a_patch_that_timed_out_but_landed_is_done_by_its_read_back(h: Harness) -> None:
    """The PATCH reaches Airflow after our timeout, nothing had started: Airflow applied it (our note is
    there), so the read-back judges it: ``done``, saying the attempt had failed, and no second PATCH. The
    detail says what every fail-mode result of this backend says: Airflow left the start_date empty
    (it lacked that sentence when the write landed after a failed attempt)."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject.append((RUNS, 0, 2.5))  # then forwarded, after our 1.5 s timeout
        # a back-off that outlasts the held PATCH: it has landed when the attempt is re-checked
        wait = lambda _: proxy.quiesce(30)  # noqa: E731
        remediator = _remediator(h, proxy.url, timeout=1.5, sleep=wait)
        sent = datetime.now(UTC)
        result = remediator.execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.DONE
    assert result.detail == (
        "run -> failed; skipped: extract, load" + NO_START_DATE + " (applied although the attempt failed: "
        "PATCH dagRun state=failed: timed out: no complete answer within 1.5 s (--airflow-timeout))"
    )
    # when it was found landed (the alert's and the ledger's committed_at), not None
    assert result.committed_at is not None and sent <= result.committed_at <= datetime.now(UTC)
    assert result.started_tasks == ()
    assert patches == 1
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.note == action.note


def test_a_last_attempt_that_timed_out_but_landed_is_done_by_its_read_back(h: Harness) -> None:
    """The only attempt's PATCH is applied at once but its answer trickles in, one byte a second, past
    our 1.5 s timeout: found landed right after the last attempt (our note is there), ``done``, saying
    the last attempt failed, with when it was found landed."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.trickle.add(RUNS)
        sent = datetime.now(UTC)
        result = _remediator(h, proxy.url, timeout=1.5, attempts=1).execute(action)
        proxy.trickle.clear()
    assert result.result is Result.DONE
    assert result.detail == (
        "run -> failed; skipped: extract, load" + NO_START_DATE + " (applied although the last attempt failed: "
        "PATCH dagRun state=failed: timed out: no complete answer within 1.5 s (--airflow-timeout))"
    )
    assert result.committed_at is not None and sent <= result.committed_at <= datetime.now(UTC)
    assert result.started_tasks == ()
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.note == action.note


def test_a_last_attempt_that_landed_after_a_task_started_names_the_task(h: Harness) -> None:
    """A worker starts ``extract`` just before the only attempt's PATCH, which Airflow applies at once
    while its answer trickles past our timeout: found landed after the last attempt, and the task that
    had started is named in the result (the alert's and the ledger's started tasks), not only in its text."""
    action = h.actions(Mode.FAIL)[0]
    warm_execution_api(h.server)
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(("PATCH " + RUNS, lambda: start_task(h.server, action.dag_id, action.run.run_id, "extract")))
        proxy.trickle.add(RUNS)
        remediator = _remediator(h, proxy.url, timeout=1.5, attempts=1)
        remediator.prepare()
        result = remediator.execute(action)
        proxy.trickle.clear()
    assert result.result is Result.CAUGHT_AFTER_START
    assert result.detail == (
        "caught after start: run -> failed; skipped: extract, load, but task(s) had started before the write "
        "landed: extract (none -> failed)" + NO_START_DATE + " (applied although the last attempt failed: "
        "PATCH dagRun state=failed: timed out: no complete answer within 1.5 s (--airflow-timeout))"
    )
    assert result.started_tasks == (StartedTask("extract", -1, None, "failed"),)
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.tasks["extract"][0] == "failed" and row.note == action.note


def test_a_bulk_skip_that_outlasts_the_timeout_is_given_up_at_the_timeout(h322: Harness) -> None:
    """Every call has a timeout, the bulk skip too: held 2.5 s by the proxy, it fails at 1.5 s."""
    (action,) = h322.actions(Mode.SKIP)
    with CountingProxy(h322.server.port) as proxy:
        proxy.inject.append((RUNS, 0, 2.5))
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, timeout=1.5, attempts=1).execute(action)
        proxy.quiesce(30)  # the held request lands after all (benchmarks/results/mutation.md: a skip half landed)
    assert result.result is Result.FAILED
    assert result.detail == (
        f"Airflow API at {proxy.url} failed 1 times: PATCH taskInstances (bulk skip): "
        "timed out: no complete answer within 1.5 s (--airflow-timeout)"
    )


def _held_past_the_lease(h: Harness, mode: Mode) -> str:
    """One write held 2.5 s by the proxy under a lease of 1 s (the call timeout 30 s): the result's detail."""
    (action, *_) = h.actions(mode)
    lease = Fence(term=1, ends=time.monotonic() + 1.0, clock=time.monotonic)
    with CountingProxy(h.server.port) as proxy:
        proxy.inject.append((RUNS, 0, 2.5))
        result = _remediator(h, proxy.url, mode=mode, attempts=1, fence=lambda: lease).execute(action)
        proxy.quiesce(30)
    assert result.result is Result.FAILED
    return result.detail.replace(proxy.url, "URL")


def test_a_bulk_skip_is_given_up_when_the_leader_lease_ends(h322: Harness) -> None:
    """Fencing: the write's timeout is clipped to the lease left, so a bulk skip held longer is not
    still open on our side when the lease ends."""
    assert (
        _held_past_the_lease(h322, Mode.SKIP)
        == "Airflow API at URL failed 1 times: PATCH taskInstances (bulk skip): timed out"
    )


def test_a_fail_patch_is_given_up_when_the_leader_lease_ends(h: Harness) -> None:
    assert (
        _held_past_the_lease(h, Mode.FAIL) == "Airflow API at URL failed 1 times: PATCH dagRun state=failed: timed out"
    )


def test_no_write_is_sent_once_the_lease_has_ended(h: Harness) -> None:
    """The fence is asked right before the PATCH: none (the lease ended) sends nothing and says so."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        result = _remediator(h, proxy.url, fence=lambda: None).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.FAILED and result.retryable
    assert result.detail == ("not written: this replica's leader lease ended (or it is waiting to act): nothing sent")
    assert patches == 0
    assert db_state(h.url)[action.run.run_id].state == "queued"


def test_a_skip_through_the_api_is_done_with_the_tasks_it_skipped_named(h322: Harness) -> None:
    """skip on 3.2: the result names what was skipped and nothing about start dates (the run is not
    failed, so Airflow's missing start_date is not this write's doing)."""
    (action,) = h322.actions(Mode.SKIP)
    result = _remediator(h322, h322.server.url, mode=Mode.SKIP).execute(action)
    assert result.result is Result.DONE
    assert result.detail == "skipped: extract, load"


# --- a bulk skip whose answer did not arrive, or whose note did not follow ----------------------------


def test_a_bulk_skip_that_landed_after_the_timeout_is_not_reported_as_someone_elses(h322: Harness) -> None:
    """The bulk skip reaches Airflow after our timeout, so the note (sent after it) never went out: the
    retry's re-check finds every task skipped and no note. That may well be our write: ``unknown``,
    saying so, not ``already`` "not stopped by dupguard's write" (what it said before)."""
    (action,) = h322.actions(Mode.SKIP)
    with CountingProxy(h322.server.port) as proxy:
        proxy.inject.append((RUNS, 0, 2.5))  # then forwarded, after our 1.5 s timeout
        wait = lambda _: proxy.quiesce(30)  # noqa: E731 - the held bulk skip lands during the back-off
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, timeout=1.5, sleep=wait).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.UNKNOWN
    assert result.detail == (
        "every task is already skipped (run state queued) (after a failed attempt: PATCH taskInstances "
        "(bulk skip): timed out: no complete answer within 1.5 s (--airflow-timeout)); dupguard's bulk skip "
        "was sent and not answered, so it may have done it: it has no note (an operator, Airflow or another "
        "writer)"
    )
    assert patches == 1  # the bulk skip only: no note claims a skip that cannot be proved ours
    row = db_state(h322.url)[action.run.run_id]
    assert {ti[0] for ti in row.tasks.values()} == {"skipped"} and row.note is None


@pytest.mark.parametrize(
    ("status", "why"),
    [
        (503, f"PATCH dagRun note: HTTP 503 {INJECTED}"),
        (403, f"PATCH dagRun note: HTTP 403 {INJECTED}: the Airflow user needs {EDIT_RUNS}"),
    ],
    ids=["503", "403"],
)
def test_a_bulk_skip_answered_whose_note_failed_is_done_by_its_read_back(h322: Harness, status: int, why: str) -> None:
    """Airflow answered the bulk skip, the note after it failed (503; 403, a user who may edit task
    instances but not runs): the tasks were skipped by our write, proved by that answer and the
    read-back: ``done``, saying the note is missing, not ``already`` "not stopped by dupguard's write"
    (what 503 said before) nor ``failed`` (what 403 said before)."""
    (action,) = h322.actions(Mode.SKIP)
    with CountingProxy(h322.server.port) as proxy:
        # the first rule forwards the bulk skip, the second answers the note's PATCH after it
        proxy.inject += [(RUNS, 0, 0.0), (RUNS, status, 0.0)]
        sent = datetime.now(UTC)
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, backoff=0.0).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.DONE
    assert result.committed_at is not None and sent <= result.committed_at <= datetime.now(UTC)
    assert result.detail == f"skipped: extract, load (applied, but its note was not written: {why})"
    assert patches == 2
    row = db_state(h322.url)[action.run.run_id]
    assert {ti[0] for ti in row.tasks.values()} == {"skipped"} and row.note is None


def test_the_note_after_a_bulk_skip_shares_the_actions_one_token_request(h322: Harness) -> None:
    """The bulk skip is answered, the note's PATCH after it is answered 401 with the token this action
    has just fetched: the note is part of the action, so no second token is asked for (api-servers that
    do not share jwt_secret would refuse it too); the skip is ours by Airflow's answer: ``done``, saying
    why the note is missing."""
    (action,) = h322.actions(Mode.SKIP)
    with CountingProxy(h322.server.port) as proxy:
        proxy.inject += [(RUNS, 0, 0.0), (RUNS, 401, 0.0)]  # the bulk skip forwarded, its note refused
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, backoff=0.0).execute(action)
        tokens = proxy.count("POST", "/auth/token")
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert (tokens, patches) == (1, 2)
    assert result.result is Result.DONE and not result.retryable
    assert result.detail == (
        f"skipped: extract, load (applied, but its note was not written: a token just issued by {proxy.url}"
        "/auth/token was rejected: check that every api-server shares [api_auth] jwt_secret, jwt_issuer and "
        "jwt_audience)"
    )
    row = db_state(h322.url)[action.run.run_id]
    assert {ti[0] for ti in row.tasks.values()} == {"skipped"} and row.note is None


# --- reads that fail after a write: the guard and the read-back through the API (--source api) --------


def _read_through_api(h: Harness, proxy: CountingProxy) -> GuardedRemediator:
    """A fail-mode remediator whose re-reads and read-backs go through the proxy too, as with
    ``--source api``, so a read can be made to fail after the write (no back-off sleeps)."""
    settings = Config.of(
        database_url=h.url, airflow_api_url=proxy.url, airflow_username="admin", airflow_password="admin"
    )
    return _remediator(h, proxy.url, states=ApiRunStates(api_reader(settings)), backoff=0.0)


def _after_the_patch(proxy: CountingProxy, *rules: int, then: Callable[[], None] = lambda: None) -> None:
    """Once the PATCH arrives (it is forwarded unless ``proxy.inject`` says otherwise): ``then``, and the
    reads after it answered in order, one status each (0: forwarded, else that status)."""

    def arm() -> None:
        then()
        proxy.inject[:0] = [(RUNS, status, 0.0) for status in rules]

    proxy.hooks.append(("PATCH " + RUNS, arm))


# the guard's re-read before the write, forwarded: the duplicate and its tasks, the kept run and its tasks
_BEFORE_THE_PATCH = [(RUNS, 0, 0.0)] * 4


def _get_failed(action: Action) -> str:
    return f"GET /api/v2/dags/{action.dag_id}/dagRuns/{quote(action.run.run_id)}: HTTP 503 {INJECTED}"


def test_a_patch_answered_whose_read_back_fails_is_unknown(h: Harness) -> None:
    """Airflow answered the PATCH, the read-back after it is answered 503: ``unknown`` ("answered by
    Airflow, but the read-back failed"), never ``done``, and the run is as the PATCH left it."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        _after_the_patch(proxy, 503)
        result = _read_through_api(h, proxy).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.UNKNOWN
    assert result.detail == (
        f"run -> failed; skipped: extract, load answered by Airflow, but the read-back failed "
        f"({_get_failed(action)}): check the run"
    )
    assert result.committed_at is not None and not result.retryable
    assert patches == 1
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.note == action.note


def test_a_run_stopped_meanwhile_whose_note_cannot_be_read_is_unknown(h: Harness) -> None:
    """Our PATCH fails (503) while an operator fails the run; the run's note cannot be read afterwards
    (503 on that read, twice), so whether our write did it cannot be told: ``unknown``, saying why."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [*_BEFORE_THE_PATCH, (RUNS, 503, 0.0)]
        # the landing check reads the run, its tasks, then its note (503); the re-check the run and its
        # tasks; then the note again (503)
        _after_the_patch(proxy, 0, 0, 503, 0, 0, 503, then=lambda: _stop_by_hand(h, action, None))
        result = _read_through_api(h, proxy).execute(action)
    assert result.result is Result.UNKNOWN
    assert result.detail == (
        f"the run is already failed (after a failed attempt: {_patch_failed(503)}); whether our write did it "
        f"is unknown (note unreadable: {_get_failed(action)})"
    )
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.note is None


def test_a_run_carrying_our_note_that_cannot_be_read_back_is_unknown(h: Harness) -> None:
    """The PATCH is answered 503 but landed (a gateway's 503 after Airflow applied it: our note is
    there); the landing check cannot read the run (503), the re-check then finds it failed: the note
    is ours, yet nothing read the run back after it, so ``unknown``, not ``done`` nor ``already``."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [*_BEFORE_THE_PATCH, (RUNS, 503, 0.0)]
        _after_the_patch(proxy, 503, then=lambda: _stop_by_hand(h, action, action.note))
        result = _read_through_api(h, proxy).execute(action)
    assert result.result is Result.UNKNOWN
    assert result.detail == (
        f"the run is already failed (after a failed attempt: {_patch_failed(503)}); our note is there but the "
        "run could not be read back"
    )


def test_a_re_check_that_cannot_read_the_run_after_a_failed_attempt_ends_the_attempts_as_failed(h: Harness) -> None:
    """Our PATCH is answered 503 (by the proxy: nothing reached Airflow), then every read of the run is
    answered 503: the landing check cannot tell, and the guard's re-check before the retry cannot read
    the run. Nothing is known to be written: ``failed``, retryable (the dispatcher re-judges and tries
    again), naming the write's failure and the re-read's, as the last attempt's failure does (was: the
    re-read's ``Transient`` escaped the backend, "Transient: GET …", the write's failure untold)."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [*_BEFORE_THE_PATCH, (RUNS, 503, 0.0)]
        _after_the_patch(proxy, 503, 503)  # the landing check's read of the run, then the re-check's
        result = _read_through_api(h, proxy).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert (result.result, result.retryable, result.retry_soon) == (Result.FAILED, True, False)
    assert result.detail == (
        f"Airflow API at {proxy.url} failed 1 times: {_patch_failed(503)}; the re-check before attempt 2 "
        f"could not read the run: {_get_failed(action)}"
    )
    assert patches == 1
    row = db_state(h.url)[action.run.run_id]
    assert (row.state, row.note) == ("queued", None)


def test_wrong_credentials_fail_at_once_and_the_next_token_request_waits_a_minute(h: Harness) -> None:
    """The backend as the daemon builds it (no options): Airflow refuses the user, the action fails at
    once naming the settings to check and the back-off before the next token request, 60 s."""
    action = h.actions(Mode.FAIL)[0]
    result = _remediator(h, h.server.url, user="nobody").execute(action)
    assert result.result is Result.FAILED
    assert result.detail == (
        f"Airflow rejected user 'nobody' at {h.server.url}/auth/token (HTTP 401 Invalid credentials): check "
        "DUPGUARD_AIRFLOW_USERNAME / DUPGUARD_AIRFLOW_PASSWORD; next attempt in 60 s"
    )
    assert db_state(h.url)[action.run.run_id].state == "queued"


def test_the_note_after_a_bulk_skip_is_fenced_too(h322: Harness) -> None:
    """Fencing asks before every write, the note's PATCH too: the lease ends once the bulk skip is
    answered, so the note is not sent (one PATCH). The tasks were skipped by our write, proved by
    Airflow's answer and the read-back: ``done``, saying the note was not written because the lease
    ended, committed when the bulk skip was answered (was: ``failed`` "not written: … nothing sent")."""
    (action,) = h322.actions(Mode.SKIP)
    lease = Fence(term=1, ends=math.inf, clock=time.monotonic)
    asked: list[Fence | None] = [lease]  # the first ask (the bulk skip) gets the lease, later ones none
    with CountingProxy(h322.server.port) as proxy:
        sent = datetime.now(UTC)
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, fence=lambda: asked.pop() if asked else None).execute(
            action
        )
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert patches == 1
    assert result.result is Result.DONE and not result.retryable
    assert result.committed_at is not None and sent <= result.committed_at <= datetime.now(UTC)
    assert result.detail == (
        "skipped: extract, load (applied, but its note was not written: this replica's leader lease ended "
        "(or it is waiting to act): nothing sent)"
    )
    row = db_state(h322.url)[action.run.run_id]
    assert {ti[0] for ti in row.tasks.values()} == {"skipped"} and row.note is None


def test_the_last_attempts_bulk_skip_answered_whose_note_failed_is_done_by_its_read_back(h322: Harness) -> None:
    """The last attempt's bulk skip is answered and its note fails (503): no retry re-checks the run, yet
    the tasks were skipped by our write: ``done`` by that answer and the read-back, saying the note is
    missing (was: ``failed`` "failed 2 times", which the dispatcher's retry then reported ``already``)."""
    (action,) = h322.actions(Mode.SKIP)
    with CountingProxy(h322.server.port) as proxy:
        # attempt 1: the bulk skip 503; attempt 2: the bulk skip forwarded, its note 503
        proxy.inject += [(RUNS, 503, 0.0), (RUNS, 0, 0.0), (RUNS, 503, 0.0)]
        sent = datetime.now(UTC)
        result = _remediator(h322, proxy.url, mode=Mode.SKIP, attempts=2, backoff=0.0).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert patches == 3
    assert result.result is Result.DONE and not result.retryable
    assert result.committed_at is not None and sent <= result.committed_at <= datetime.now(UTC)
    assert result.detail == (
        f"skipped: extract, load (applied, but its note was not written: PATCH dagRun note: HTTP 503 {INJECTED})"
    )
    row = db_state(h322.url)[action.run.run_id]
    assert {ti[0] for ti in row.tasks.values()} == {"skipped"} and row.note is None

"""Backend ``api`` against a real Airflow API server, on duplicates made by Airflow's own scheduler code.

One server per Airflow version per session (tests.airflow_server); each test re-creates the live
database from an Airflow-made scenario. After every action the run, every task instance and the
note are asserted in the database, and every run that was not the action's target must be unchanged.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine
from structlog.testing import capture_logs

from detector.actions.alerts.channels.webhook import webhook_payload
from detector.actions.alerts.group_text import plain_text
from detector.actions.alerts.slack_messages import detected_message, outcome_message
from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.run import run_daemon
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, Outcome, plan
from detector.core.ports import AlertEvent, AlertKind, Result, StartedTask
from detector.errors import ConfigError
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import (
    JWT_SECRET,
    AirflowServer,
    CountingProxy,
    ServerPool,
    db_state,
    free_port,
    sql,
    start_task,
    warm_execution_api,
)
from tests.pg import ground_truth

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

JWT_LIFETIME = 6  # seconds: short, so the expiry test needs no second server
FANOUT = "race_asset_fanout"  # 3 consumer DAGs, a duplicate pair each, nothing started
STARTED = "race_asset"  # the duplicate's first task already ran


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.1.2", [FANOUT, STARTED], jwt_expiration=JWT_LIFETIME)


@pytest.fixture(scope="module")
def af322(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.2.2", ["race_partitioned"])


@pytest.fixture
def fanout(af312: AirflowServer) -> Iterator[str]:
    yield af312.reset(FANOUT)


class Harness:
    """Plans actions for the live database and builds remediators pointed at the server."""

    def __init__(self, server: AirflowServer, url: str) -> None:
        self.server = server
        self.url = url
        self.engine: Engine = make_engine(parse_url(url))
        self.db = open_airflow_db(self.engine)
        self.made: list[GuardedRemediator] = []

    def actions(self, mode: Mode, *, remediate_started: bool = False) -> list[Action]:
        now = datetime.now(UTC)
        report = scan(self.db, now=now)
        return plan(report.findings, mode, now=now, remediate_started=remediate_started)

    def remediator(self, mode: Mode, *, api_url: str | None = None, **overrides: Any) -> GuardedRemediator:
        options = {k: overrides.pop(k) for k in ("auth_backoff", "attempts", "backoff") if k in overrides}
        settings: dict[str, Any] = {
            "database_url": self.url,
            "remediation": mode.value,
            "remediation_backend": "api",
            "airflow_api_url": api_url or self.server.url,
            "airflow_username": "admin",
            "airflow_password": "admin",
        } | overrides
        remediator = build_remediator(Config.of(**settings), self.engine, self.db.tables, Metrics(), **options)
        assert isinstance(remediator, GuardedRemediator)
        self.made.append(remediator)
        return remediator

    def close(self) -> None:
        for remediator in self.made:
            remediator.close()
        self.engine.dispose()


@pytest.fixture
def h(af312: AirflowServer, fanout: str) -> Iterator[Harness]:
    harness = Harness(af312, fanout)
    yield harness
    harness.close()


def _unchanged_except(before: dict[str, Any], after: dict[str, Any], targets: set[str]) -> None:
    assert before.keys() == after.keys()
    for run_id, row in before.items():
        if run_id not in targets:
            assert after[run_id] == row, f"{run_id} changed but was not a target"


# --- the modes -----------------------------------------------------------------------------------


def test_fail_marks_each_duplicate_failed_skips_its_tasks_and_notes_it(h: Harness) -> None:
    """fail: run failed with end_date, unstarted TIs skipped, the note on the run; kept runs untouched."""
    actions = h.actions(Mode.FAIL)
    assert len(actions) == 3 and all(a.outcome is Outcome.REMEDIATE for a in actions)
    before = db_state(h.url)
    remediator = h.remediator(Mode.FAIL)
    results = [remediator.execute(a) for a in actions]
    after = db_state(h.url)

    assert [r.result for r in results] == [Result.DONE] * 3
    assert all(r.committed_at is not None for r in results)
    for action in actions:
        row = after[action.run.run_id]
        assert row.state == "failed" and row.end_date is not None
        assert {name: ti[0] for name, ti in row.tasks.items()} == {"extract": "skipped", "load": "skipped"}
        assert row.note == action.note and "dupguard stopped this run" in row.note
        assert action.kept_run_id in row.note
        kept = after[action.kept_run_id]
        assert kept == before[action.kept_run_id] and kept.state == "queued" and kept.note is None
    _unchanged_except(before, after, {a.run.run_id for a in actions})
    truth = ground_truth("3.1.2", FANOUT)
    assert sorted(a.kept_run_id for a in actions) == sorted(g["first_run_id"] for g in truth["expected_groups"])


def test_skip_through_the_api_is_refused_on_3_1_at_start_up(h: Harness, capsys: pytest.CaptureFixture[str]) -> None:
    """api + skip on 3.1: the scheduler can put skipped tasks back (DagRun.schedule_tis updates by id
    without a state check), so the combination is refused before anything is sent: ConfigError from the
    factory, exit code 2 with one line from ``dupguard run``."""
    before = db_state(h.url)
    with pytest.raises(ConfigError, match=r"refused on Airflow 3\.1") as refused:
        h.remediator(Mode.SKIP)
    assert "DUPGUARD_REMEDIATION=fail" in str(refused.value)
    env = {
        "DUPGUARD_DATABASE_URL": h.url,
        "DUPGUARD_REMEDIATION": "skip",
        "DUPGUARD_REMEDIATION_BACKEND": "api",
        "DUPGUARD_AIRFLOW_API_URL": h.server.url,
        "DUPGUARD_AIRFLOW_USERNAME": "admin",
        "DUPGUARD_AIRFLOW_PASSWORD": "admin",
        "DUPGUARD_HTTP_PORT": "0",
        "DUPGUARD_LOG_FORMAT": "json",
    }
    assert run_daemon({}, env=env, once=True, install_signals=False) == 2
    err = capsys.readouterr().err
    assert "skip with DUPGUARD_REMEDIATION_BACKEND=api is refused on Airflow 3.1" in err
    assert "Traceback" not in err and "dupguard: invalid configuration" in err
    assert db_state(h.url) == before


def test_second_execute_is_already_and_writes_nothing(h: Harness) -> None:
    """Idempotent: the same action again is ALREADY, with no further write."""
    mode = Mode.FAIL
    action = h.actions(mode)[0]
    remediator = h.remediator(mode)
    assert remediator.execute(action).result is Result.DONE
    after_first = db_state(h.url)
    again = remediator.execute(action)
    assert again.result is Result.ALREADY
    assert db_state(h.url) == after_first


@pytest.mark.parametrize("mode", [Mode.DRY_RUN, Mode.OFF])
def test_dry_run_and_off_write_nothing_and_send_nothing(h: Harness, mode: Mode) -> None:
    """dry-run logs "would …" (DRY_RUN) and off does nothing (SKIPPED); neither writes nor calls the API."""
    actions = h.actions(mode)
    before = db_state(h.url)
    with CountingProxy(h.server.port) as proxy:
        remediator = h.remediator(mode, api_url=proxy.url)
        results = [remediator.execute(a) for a in actions]
    assert db_state(h.url) == before
    assert sum(proxy.requests.values()) == 0
    expected = Result.DRY_RUN if mode is Mode.DRY_RUN else Result.SKIPPED
    assert [r.result for r in results] == [expected] * 3
    if mode is Mode.DRY_RUN:
        assert all("would fail the run" in r.detail for r in results)


# --- the guard -----------------------------------------------------------------------------------


def test_a_task_that_started_after_planning_makes_it_too_late_and_untouched(h: Harness) -> None:
    """The re-read right before acting sees a TI running: TOO_LATE, nothing written, no API call."""
    action = h.actions(Mode.FAIL)[0]
    sql(
        h.url,
        "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    before = db_state(h.url)
    with CountingProxy(h.server.port) as proxy:
        result = h.remediator(Mode.FAIL, api_url=proxy.url).execute(action)
    assert result.result is Result.TOO_LATE
    assert "too late, both runs executed" in result.detail and "extract=running" in result.detail
    assert db_state(h.url) == before
    assert sum(proxy.requests.values()) == 0


def test_airflow_made_duplicate_whose_task_already_ran(af312: AirflowServer) -> None:
    """race_asset: the duplicate's extract already succeeded. Planned TOO_LATE; with
    remediate_started the run is failed, the finished task kept, the unstarted one skipped, and the
    result is ``caught_after_start`` naming extract (Airflow recorded that it ran): never ``done``."""
    url = af312.reset(STARTED)
    h = Harness(af312, url)
    try:
        before = db_state(url)
        (action,) = h.actions(Mode.FAIL)
        assert action.outcome is Outcome.TOO_LATE
        assert h.remediator(Mode.FAIL).execute(action).result is Result.TOO_LATE
        assert db_state(url) == before

        (forced,) = h.actions(Mode.FAIL, remediate_started=True)
        assert forced.outcome is Outcome.REMEDIATE
        result = h.remediator(Mode.FAIL, remediate_started=True).execute(forced)
        assert result.result is Result.CAUGHT_AFTER_START, result.detail
        assert result.started_tasks == (StartedTask("extract", -1, "success", "success"),)
        row = db_state(url)[forced.run.run_id]
        assert row.state == "failed"
        assert (
            row.tasks["extract"][0] == "success" and row.tasks["extract"] == before[forced.run.run_id].tasks["extract"]
        )
        assert row.tasks["load"][0] == "skipped"
        assert row.note == forced.note
        _unchanged_except(before, db_state(url), {forced.run.run_id})
    finally:
        h.close()


def test_run_deleted_before_the_patch_is_gone_and_not_retried(h: Harness) -> None:
    """404 from the API (the run was deleted between the re-read and the PATCH): GONE, one request."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(
            ("/api/v2/dags/", lambda: sql(h.url, "DELETE FROM dag_run WHERE run_id=:r", r=action.run.run_id))
        )
        result = h.remediator(Mode.FAIL, api_url=proxy.url).execute(action)
        patches = sum(n for (m, p), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.GONE and "404" in result.detail
    assert patches == 1
    assert action.run.run_id not in db_state(h.url)


def test_run_deleted_before_the_action_is_gone_without_a_call(h: Harness) -> None:
    action = h.actions(Mode.FAIL)[0]
    sql(h.url, "DELETE FROM dag_run WHERE run_id=:r", r=action.run.run_id)
    with CountingProxy(h.server.port) as proxy:
        result = h.remediator(Mode.FAIL, api_url=proxy.url).execute(action)
    assert result.result is Result.GONE
    assert sum(proxy.requests.values()) == 0


def test_a_task_started_between_the_re_read_and_the_patch_is_caught_after_start(h: Harness) -> None:
    """The 85-220 ms window: the guard's re-read sees nothing started, then a worker starts ``extract``
    through Airflow's own Execution API (ti_run, QUEUED -> RUNNING) before the PATCH reaches the server.
    Airflow's set-failed stops the running task (FAILED). The read-back after the write reports that:
    ``caught_after_start`` naming the task, counted apart, in the alert texts and the webhook payload —
    not ``done``."""
    action = h.actions(Mode.FAIL)[0]
    planned_at = datetime.now(UTC)
    finding = next(f for f in scan(h.db, now=planned_at).findings if f.key == action.finding_key)
    warm_execution_api(h.server)  # its first call takes seconds; the token here lives JWT_LIFETIME s
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(("/api/v2/dags/", lambda: start_task(h.server, action.dag_id, action.run.run_id, "extract")))
        remediator = h.remediator(Mode.FAIL, api_url=proxy.url, airflow_timeout=timedelta(seconds=60))
        result = remediator.execute(action)

    row = db_state(h.url)[action.run.run_id]  # ground truth: what Airflow recorded
    assert row.state == "failed" and row.tasks["extract"][0] == "failed" and row.tasks["load"][0] == "skipped"
    assert result.result is Result.CAUGHT_AFTER_START, result.detail
    assert result.started_tasks == (StartedTask("extract", -1, None, "failed"),)
    assert result.committed_at is not None and "extract (none -> failed)" in result.detail
    assert remediator.metrics is not None
    labels = {"mode": "fail", "backend": "api"}
    registry = remediator.metrics.registry
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "caught_after_start"}) == 1
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "done"}) is None

    event = AlertEvent(AlertKind.OUTCOME, finding, planned_at, "prod", "fail", (action,), (result,))
    payload = webhook_payload(event)
    # a task ran: the duplicate did harm, so it pages (critical; the webhook's word for it is "error")
    assert payload["severity"] == "error" and payload["remediation"]["status"] == "caught_after_start"
    (entry,) = payload["remediation"]["results"]
    assert entry["result"] == "caught_after_start"
    assert entry["started_tasks"] == [
        {"task_id": "extract", "map_index": -1, "state_before": None, "state_after": "failed"}
    ]
    for message in (detected_message(event), outcome_message(event)):
        shown = json.dumps(message.blocks)
        assert "extract (none -&gt; failed)" in shown and "stopped mid-run" in shown
        assert "extract" in message.text
    assert "caught after start" in plain_text(event) and "extract (none -> failed)" in plain_text(event)


# --- auth ----------------------------------------------------------------------------------------


def test_expired_token_is_refreshed_before_use(h: Harness) -> None:
    """The JWT lives JWT_LIFETIME s (server-side, leeway 0); after it expires the next action fetches a
    new one first instead of failing."""
    actions = h.actions(Mode.FAIL)
    with CountingProxy(h.server.port) as proxy:
        remediator = h.remediator(Mode.FAIL, api_url=proxy.url)
        assert remediator.execute(actions[0]).result is Result.DONE
        assert remediator.execute(actions[1]).result is Result.DONE  # token still fresh: reused
        assert proxy.count("POST", "/auth/token") == 1
        time.sleep(JWT_LIFETIME + 0.5)
        assert remediator.execute(actions[2]).result is Result.DONE
        assert proxy.count("POST", "/auth/token") == 2
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert patches == 3  # no 401 round trip


def _jwt(*, key: str, exp_in: float) -> str:
    """An HS512 JWT shaped like Airflow's simple auth manager token for admin."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    now = int(time.time())
    claims = {
        "sub": "admin",
        "role": "admin",
        "iss": "airflow",
        "aud": "apache-airflow",
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + int(exp_in),
    }
    head = b64(json.dumps({"alg": "HS512", "typ": "JWT"}).encode())
    body = b64(json.dumps(claims).encode())
    sig = b64(hmac.new(key.encode(), f"{head}.{body}".encode(), hashlib.sha512).digest())
    return f"{head}.{body}.{sig}"


@pytest.mark.parametrize(
    ("token", "server_says"),
    [
        (lambda: _jwt(key=JWT_SECRET, exp_in=-30), "401 Token Expired"),
        (lambda: _jwt(key="some-other-secret", exp_in=3600), "403 Invalid JWT token (secret rotated)"),
    ],
    ids=["expired", "wrong-key"],
)
def test_a_rejected_cached_token_is_replaced_once_and_the_action_succeeds(
    h: Harness, token: Any, server_says: str
) -> None:
    """The cached token is refused (as if our clock were off, or jwt_secret had rotated): one new token."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        remediator = h.remediator(Mode.FAIL, api_url=proxy.url)
        backend = remediator.backend
        assert isinstance(backend, ApiBackend)
        backend.tokens._token = token()
        backend.tokens._refresh_at = float("inf")  # do not refresh proactively: let the server refuse it
        result = remediator.execute(action)
        assert proxy.count("POST", "/auth/token") == 1
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.DONE, result.detail
    assert patches == 2
    assert db_state(h.url)[action.run.run_id].state == "failed"


def test_static_token_that_is_rejected_fails_clearly(h: Harness) -> None:
    action = h.actions(Mode.FAIL)[0]
    before = db_state(h.url)
    result = h.remediator(
        Mode.FAIL, airflow_token=_jwt(key=JWT_SECRET, exp_in=-30), airflow_username=None, airflow_password=None
    ).execute(action)
    assert result.result is Result.FAILED and "static DUPGUARD_AIRFLOW_TOKEN was rejected" in result.detail
    assert db_state(h.url) == before


def test_wrong_credentials_fail_clearly_with_one_token_request_per_action_and_a_back_off(h: Harness) -> None:
    """No retry storm: exactly one POST /auth/token for the first action, none while backing off."""
    actions = h.actions(Mode.FAIL)
    before = db_state(h.url)
    with CountingProxy(h.server.port) as proxy:
        remediator = h.remediator(Mode.FAIL, api_url=proxy.url, airflow_password="wrong")
        first = remediator.execute(actions[0])
        assert proxy.count("POST", "/auth/token") == 1
        second = remediator.execute(actions[1])
        assert proxy.count("POST", "/auth/token") == 1  # backing off: not even asked
        no_backoff = h.remediator(Mode.FAIL, api_url=proxy.url, airflow_password="wrong", auth_backoff=0)
        for action in actions:
            assert no_backoff.execute(action).result is Result.FAILED
        assert proxy.count("POST", "/auth/token") == 1 + len(actions)  # exactly one per action
        assert sum(n for (m, _), n in proxy.requests.items() if m == "PATCH") == 0
    assert first.result is Result.FAILED
    assert "rejected user 'admin'" in first.detail and "DUPGUARD_AIRFLOW_PASSWORD" in first.detail
    assert "wrong" not in first.detail.replace("wrong credentials", "")  # never the password
    assert second.result is Result.FAILED and "not asking again" in second.detail
    assert db_state(h.url) == before


def test_a_user_without_edit_rights_gets_a_clear_403(h: Harness) -> None:
    action = h.actions(Mode.FAIL)[0]
    before = db_state(h.url)
    result = h.remediator(Mode.FAIL, airflow_username="viewer", airflow_password="viewer").execute(action)
    assert result.result is Result.FAILED
    assert "HTTP 403" in result.detail and "\n" not in result.detail
    assert '"can edit" on DAGs and DAG Runs' in result.detail and "role user or higher" in result.detail
    assert db_state(h.url) == before


# --- a flaky or absent server ----------------------------------------------------------------------


def test_api_down_is_a_clear_failure_after_bounded_retries(h: Harness) -> None:
    """Port closed: FAILED with a message naming the URL and the cause; no exception escapes."""
    action = h.actions(Mode.FAIL)[0]
    before = db_state(h.url)
    down = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    result = h.remediator(Mode.FAIL, api_url=down, attempts=3, backoff=0.05).execute(action)
    assert time.monotonic() - started < 5
    assert result.result is Result.FAILED
    assert down in result.detail and "connection refused" in result.detail and "3 times" in result.detail
    assert result.retryable and result.retry_soon  # nothing reached Airflow: retry at the first back-off
    assert db_state(h.url) == before


def test_a_server_answering_5xx_is_not_retried_soon(h: Harness) -> None:
    """The request reached a struggling server: the dispatcher's doubling back-off applies."""
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.outage = 503
        result = h.remediator(Mode.FAIL, api_url=proxy.url, attempts=2, backoff=0.05).execute(action)
    assert result.result is Result.FAILED and "HTTP 503" in result.detail
    assert result.retryable and not result.retry_soon


def test_5xx_is_retried_with_a_recheck_and_then_done(h: Harness) -> None:
    action = h.actions(Mode.FAIL)[0]
    with CountingProxy(h.server.port) as proxy:
        proxy.inject.append(("/api/v2/dags/", 503, 0.0))
        result = h.remediator(Mode.FAIL, api_url=proxy.url, backoff=0.05).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.DONE, result.detail
    assert patches == 2
    assert db_state(h.url)[action.run.run_id].state == "failed"


def test_a_patch_that_timed_out_but_landed_is_judged_by_the_read_back(h: Harness) -> None:
    """A worker starts ``extract`` and the PATCH then reaches Airflow only after dupguard's timeout: Airflow
    applied it (the run carries our note) and stopped the running task. The result is that write,
    ``caught_after_start`` naming the task, with no second PATCH — not ``too_late`` (the re-check
    alone would see a failed task and call it too late although dupguard stopped it)."""
    action = h.actions(Mode.FAIL)[0]
    warm_execution_api(h.server)
    with CountingProxy(h.server.port) as proxy:
        proxy.hooks.append(("/api/v2/dags/", lambda: start_task(h.server, action.dag_id, action.run.run_id, "extract")))
        proxy.inject.append(("/api/v2/dags/", 0, 2.5))  # then forwarded, after our 1.5 s timeout
        remediator = h.remediator(Mode.FAIL, api_url=proxy.url, airflow_timeout=timedelta(seconds=1.5), backoff=4.0)
        remediator.prepare()
        result = remediator.execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "failed" and row.tasks["extract"][0] == "failed" and row.note == action.note
    assert patches == 1
    assert result.result is Result.CAUGHT_AFTER_START, result.detail
    assert "applied although the attempt failed" in result.detail and "timed out" in result.detail
    assert result.started_tasks == (StartedTask("extract", -1, None, "failed"),)


def test_a_task_starting_during_the_retry_back_off_stops_the_retries(h: Harness) -> None:
    """Retries only while the run has not started: the re-check between attempts sees the TI running."""
    action = h.actions(Mode.FAIL)[0]

    def start_task() -> None:
        sql(
            h.url, "UPDATE task_instance SET state='running' WHERE run_id=:r AND task_id='extract'", r=action.run.run_id
        )

    with CountingProxy(h.server.port) as proxy:
        proxy.inject.append(("/api/v2/dags/", 503, 0.0))
        proxy.hooks.append(("/api/v2/dags/", start_task))
        result = h.remediator(Mode.FAIL, api_url=proxy.url, backoff=0.05).execute(action)
        patches = sum(n for (m, _), n in proxy.requests.items() if m == "PATCH")
    assert result.result is Result.TOO_LATE and "after a failed attempt" in result.detail
    assert patches == 1
    row = db_state(h.url)[action.run.run_id]
    assert row.state == "queued" and row.tasks["extract"][0] == "running" and row.note is None


def test_metrics_count_results_and_latency(h: Harness) -> None:
    actions = h.actions(Mode.FAIL)
    remediator = h.remediator(Mode.FAIL)
    remediator.execute(actions[0])
    remediator.execute(actions[0])
    assert remediator.metrics is not None
    registry = remediator.metrics.registry
    labels = {"mode": "fail", "backend": "api"}
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "done"}) == 1
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "already"}) == 1
    assert registry.get_sample_value("dupguard_remediation_latency_seconds_count") == 1


# --- Airflow 3.2: partitioned duplicates -------------------------------------------------------------


def test_partitioned_duplicate_on_3_2_is_failed_through_the_api(af322: AirflowServer) -> None:
    """3.2.2's unlocked partitioned path made two runs for one partition key: the later is failed."""
    url = af322.reset("race_partitioned")
    h = Harness(af322, url)
    try:
        truth = ground_truth("3.2.2", "race_partitioned")
        (group,) = truth["expected_groups"]
        (action,) = h.actions(Mode.FAIL)
        assert action.kept_run_id == group["first_run_id"]
        assert action.run.partition_key == group["partition_key"]
        before = db_state(url)
        result = h.remediator(Mode.FAIL).execute(action)
        assert result.result is Result.DONE, result.detail
        after = db_state(url)
        row = after[action.run.run_id]
        assert row.state == "failed" and {ti[0] for ti in row.tasks.values()} == {"skipped"}
        assert row.note == action.note and row.note_user == "admin"
        _unchanged_except(before, after, {action.run.run_id})
    finally:
        h.close()


def test_skip_on_3_2_skips_every_unfinished_task_and_leaves_the_run_to_the_scheduler(af322: AirflowServer) -> None:
    """skip through the API where it is allowed (3.2+, whose schedule_tis re-checks the state): every TI
    skipped with one bulk call, the run state untouched, the note set, the kept run untouched; a second
    execute is ALREADY and writes nothing."""
    url = af322.reset("race_partitioned")
    h = Harness(af322, url)
    try:
        (action,) = h.actions(Mode.SKIP)
        before = db_state(url)
        remediator = h.remediator(Mode.SKIP)
        result = remediator.execute(action)
        assert result.result is Result.DONE, result.detail
        after = db_state(url)
        row = after[action.run.run_id]
        assert row.state == before[action.run.run_id].state
        assert {ti[0] for ti in row.tasks.values()} == {"skipped"}
        assert row.note == action.note
        _unchanged_except(before, after, {action.run.run_id})
        assert remediator.execute(action).result is Result.ALREADY
        assert db_state(url) == after
    finally:
        h.close()


def test_prepare_fetches_the_token_before_any_duplicate_needs_it(h: Harness) -> None:
    """prepare() (the daemon calls it every leader check) logs in ahead of time, once: the first
    remediation then sends no token request, and a further prepare() with a fresh token sends none."""
    remediator = h.remediator(Mode.FAIL)
    backend = remediator.backend
    assert isinstance(backend, ApiBackend)
    remediator.prepare()
    assert backend.tokens.requests_sent == 1
    remediator.prepare()
    assert backend.tokens.requests_sent == 1
    action = next(a for a in h.actions(Mode.FAIL) if a.writes)
    assert remediator.execute(action).result is Result.DONE
    assert backend.tokens.requests_sent == 1


def test_prepare_with_wrong_credentials_never_raises_nor_storms(h: Harness) -> None:
    """Wrong credentials: prepare() backs off instead of asking again every second, and logs the
    failure once (not at every leader check); a token that arrives later is logged once too."""
    remediator = h.remediator(Mode.FAIL, airflow_password="wrong")
    backend = remediator.backend
    assert isinstance(backend, ApiBackend)
    with capture_logs() as logs:
        for _ in range(5):
            remediator.prepare()
        assert backend.tokens.requests_sent == 1
        backend.tokens._password = "admin"  # the operator fixed the Secret; the back-off has passed
        backend.tokens._blocked_until = 0.0
        for _ in range(3):
            remediator.prepare()
    events = [e["event"] for e in logs if e["event"].startswith("airflow_token")]
    assert events == ["airflow_token_unavailable", "airflow_token_available"]
    assert "rejected user 'admin'" in next(e["error"] for e in logs if e["event"] == "airflow_token_unavailable")


def test_token_endpoint_500_twice_reports_the_500_not_the_jwt_secret(h: Harness) -> None:
    """POST /auth/token answering 500 is the server failing, not a rejected token: it is retried, and when
    it keeps failing the result says HTTP 500 (not "check jwt_secret"); a third answer lets it through."""
    actions = h.actions(Mode.FAIL)
    with CountingProxy(h.server.port) as proxy:
        proxy.inject += [("/auth/token", 500, 0.0), ("/auth/token", 500, 0.0)]
        failed = h.remediator(Mode.FAIL, api_url=proxy.url, attempts=2, backoff=0.05).execute(actions[0])
        assert proxy.count("POST", "/auth/token") == 2
        proxy.inject += [("/auth/token", 500, 0.0), ("/auth/token", 500, 0.0)]
        done = h.remediator(Mode.FAIL, api_url=proxy.url, attempts=3, backoff=0.05).execute(actions[1])
    assert failed.result is Result.FAILED
    assert "HTTP 500" in failed.detail and "/auth/token" in failed.detail, failed.detail
    assert "jwt_secret" not in failed.detail
    assert done.result is Result.DONE, done.detail
    assert db_state(h.url)[actions[1].run.run_id].state == "failed"


def test_a_token_endpoint_answering_an_html_page_is_named_as_such(h: Harness) -> None:
    """POST /auth/token answered 200 with an HTML page (a proxy's sign-in page): the result names the
    status, content type and size, as the REST source does for any 2xx that is not JSON (was: "HTTP 200
    without an access_token", as if Airflow had answered JSON without the field)."""
    action = h.actions(Mode.FAIL)[0]
    page = b"<html><body>Sign in</body></html>"
    with CountingProxy(h.server.port) as proxy:
        proxy.answers.append(("/auth/token", 200, "text/html; charset=utf-8", page))
        result = h.remediator(Mode.FAIL, api_url=proxy.url, attempts=1).execute(action)
    assert result.result is Result.FAILED
    assert result.detail == (
        f"AirflowApiError: POST {proxy.url}/auth/token: HTTP 200 answer is not JSON (Content-Type text/html; "
        f"charset=utf-8, "
        f"{len(page)} bytes)"
    )
    assert db_state(h.url)[action.run.run_id].state == "queued"


def test_api_url_userinfo_never_reaches_a_result(h: Harness) -> None:
    """An API URL with a password in its userinfo is shown masked in every result text."""
    action = h.actions(Mode.FAIL)[0]
    down = f"http://admin:Mk-userinfo-pw@127.0.0.1:{free_port()}"
    result = h.remediator(Mode.FAIL, api_url=down, attempts=2, backoff=0.05).execute(action)
    assert result.result is Result.FAILED
    assert "Mk-userinfo-pw" not in result.detail and "admin:***@127.0.0.1" in result.detail

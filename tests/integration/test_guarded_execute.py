"""What ``GuardedRemediator.execute`` reports, counts and logs for a write, pinned whole where mutation
testing found it unpinned (benchmarks/results/mutation.md): the ``remediation`` line and the metrics of a
committed stop and of a stop caught after start, a write fenced off (leadership lost: nothing counted,
retried), a database that cannot be reached and a lock wait that timed out (failures retried, their
cause's first line), and a refused mode. The ``db`` backend on real PostgreSQL with Airflow 3.1.2's
schema, duplicates made by its scheduler code; the pure cases are in tests/unit/test_guarded_results.py."""

from __future__ import annotations

import socket
from dataclasses import replace
from typing import Any

import psycopg2
import pytest
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.actions.remediation.db import DbBackend
from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode
from detector.core.ports import RemediationResult, Result, StartedTask
from detector.metadb.engine import make_engine, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.integration.test_remediation_db import Db

pytestmark = pytest.mark.integration

ELAPSED = 0.25034
LEASE_ENDED = "this replica's leader lease ended (or it is waiting to act): nothing written"


def _remediator(db: Db, backend: DbBackend, **options: Any) -> tuple[GuardedRemediator, Metrics]:
    """Its clock reads 10 s, then 10.25034 s: the attempt takes 250.3 ms (logged to 0.1 ms)."""
    metrics = Metrics()
    ticks = iter([10.0, 10.0 + ELAPSED])
    remediator = GuardedRemediator(
        configured_mode=Mode.FAIL,
        backend=backend,
        engine=db.engine,
        tables=db.db.tables,
        metrics=metrics,
        clock=lambda: next(ticks),
        **options,
    )
    return remediator, metrics


def _line(action: Action, result: RemediationResult, level: str, **more: Any) -> dict[str, Any]:
    return {
        "logger_name": "dupguard.remediation",
        "event": "remediation",
        "log_level": level,
        "result": result.result.value,
        "mode": "fail",
        "outcome": "remediate",
        "backend": "db",
        "dag_id": action.dag_id,
        "run_id": action.run.run_id,
        "kept_run_id": action.kept_run_id,
        "finding_key": action.finding_key,
        "detail": result.detail,
        "started_tasks": [],
        "elapsed_ms": 250.3,
    } | more


def _counted(metrics: Metrics, result: str) -> float | None:
    labels = {"mode": "fail", "backend": "db", "result": result}
    return metrics.registry.get_sample_value("dupguard_remediations_total", labels)


def _latency(metrics: Metrics) -> tuple[float | None, float | None]:
    r = metrics.registry
    name = "dupguard_remediation_latency_seconds"
    return r.get_sample_value(f"{name}_count"), r.get_sample_value(f"{name}_sum")


def test_a_committed_stop_is_logged_counted_and_timed(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    remediator, metrics = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables))
    with capture_logs() as logs:
        result = remediator.execute(action)
    assert (result.result, result.retryable, result.retry_soon) == (Result.DONE, False, False)
    assert result.committed_at is not None and result.started_tasks == ()
    assert logs == [_line(action, result, "info")]
    assert _counted(metrics, "done") == 1
    assert _latency(metrics) == (1, 10.0 + ELAPSED - 10.0)  # the clock's difference, float rounding included


def test_a_stop_caught_after_start_names_the_tasks_it_stopped(fanout: Db) -> None:
    """``DUPGUARD_REMEDIATE_STARTED``: the running task is failed, and the line says it had started."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    backend = DbBackend(fanout.engine, fanout.db.tables, remediate_started=True)
    remediator, metrics = _remediator(fanout, backend, remediate_started=True)
    with capture_logs() as logs:
        result = remediator.execute(action)
    assert result.result is Result.CAUGHT_AFTER_START and not result.retryable
    assert result.started_tasks == (StartedTask("extract", -1, "running", "failed"),)
    assert logs == [_line(action, result, "warning", started_tasks=["extract (running -> failed)"])]
    assert _counted(metrics, "caught_after_start") == 1
    assert _latency(metrics) == (1, 10.0 + ELAPSED - 10.0)  # the clock's difference, float rounding included


def test_a_write_fenced_off_is_not_counted_and_is_retried(fanout: Db) -> None:
    """The lease ended before the write: nothing written, no result counted (the dispatcher waits for
    leadership and judges again), one ``remediation_fenced`` line."""
    action = fanout.actions(Mode.FAIL)[0]
    before = db_state(fanout.url)
    remediator, metrics = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables, fence=lambda: None))
    with capture_logs() as logs:
        result = remediator.execute(action)
    assert result == RemediationResult(action, Result.FAILED, f"not written: {LEASE_ENDED}", retryable=True)
    assert logs == [
        {
            "logger_name": "dupguard.remediation",
            "event": "remediation_fenced",
            "log_level": "info",
            "dag_id": action.dag_id,
            "run_id": action.run.run_id,
            "detail": LEASE_ENDED,
        }
    ]
    assert _counted(metrics, "failed") is None and _latency(metrics) == (0, 0)
    assert db_state(fanout.url) == before


def test_an_unreachable_database_is_a_failure_retried_with_its_cause(fanout: Db) -> None:
    """The re-read cannot connect: FAILED, retryable, the cause's type and first line; not timed."""
    action = fanout.actions(Mode.FAIL)[0]
    closed = make_engine(parse_url("postgresql://dupguard@127.0.0.1:1/airflow"))
    try:
        remediator = GuardedRemediator(
            configured_mode=Mode.FAIL,
            backend=DbBackend(closed, fanout.db.tables),
            engine=closed,
            tables=fanout.db.tables,
            metrics=(metrics := Metrics()),
        )
        with capture_logs() as logs:
            result = remediator.execute(action)
    finally:
        closed.dispose()
    assert (result.result, result.retryable, result.retry_soon) == (Result.FAILED, True, False)
    assert (
        result.detail
        == "DatabaseError: database postgresql+psycopg2://dupguard@127.0.0.1:1/airflow: Connection refused"
    )
    [line] = logs
    assert (line["event"], line["log_level"], line["detail"]) == ("remediation", "warning", result.detail)
    assert _counted(metrics, "failed") == 1 and _latency(metrics) == (0, 0)


def test_a_write_that_times_out_on_a_lock_reports_its_errors_first_line(fanout: Db) -> None:
    """Another transaction holds the duplicate's row (as Airflow's scheduler does while it examines a
    run) past the write's lock timeout: the driver's error is several lines (statement, background
    link); the result and the line carry its type and first line only, and the attempt is retried."""
    action = fanout.actions(Mode.FAIL)[0]
    before = db_state(fanout.url)
    other = psycopg2.connect(make_url(fanout.url).render_as_string(hide_password=False))
    try:
        with other.cursor() as cur:
            cur.execute("SELECT id FROM dag_run WHERE id = %s FOR UPDATE", (action.run.id,))
        remediator, metrics = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables, lock_timeout_ms=50))
        with capture_logs() as logs:
            result = remediator.execute(action)
    finally:
        other.close()
    detail = "OperationalError: (psycopg2.errors.LockNotAvailable) canceling statement due to lock timeout"
    assert result == RemediationResult(action, Result.FAILED, detail, retryable=True)
    assert logs == [_line(action, result, "warning")]
    assert _counted(metrics, "failed") == 1 and _latency(metrics) == (0, 0)
    assert db_state(fanout.url) == before


def test_a_refused_api_connection_is_retried_soon(fanout: Db) -> None:
    """The ``api`` backend and nothing listening at the API's address: nothing reached Airflow, so
    the dispatcher retries at its shortest back-off (the duplicate's worker retries too)."""
    action = fanout.actions(Mode.FAIL)[0]
    before = db_state(fanout.url)
    with socket.socket() as closed:  # a port bound, never listening: the connection is refused
        closed.bind(("127.0.0.1", 0))
        api = f"http://127.0.0.1:{closed.getsockname()[1]}"
        settings = {"remediation": "fail", "remediation_backend": "api", "airflow_api_url": api, "airflow_token": "t"}
        config = Config.of(database_url=fanout.url, **settings)
        remediator = build_remediator(
            config, fanout.engine, fanout.db.tables, Metrics(), attempts=2, sleep=lambda _: None
        )
        try:
            result = remediator.execute(action)
        finally:
            remediator.close()
    assert (result.result, result.retryable, result.retry_soon) == (Result.FAILED, True, True)
    refused = "connection refused or unreachable (is the API server up?)"
    assert result.detail == f"Airflow API at {api} failed 2 times: PATCH dagRun state=failed: {refused}"
    assert db_state(fanout.url) == before


def test_a_dry_run_refuses_as_the_real_run_would_once_the_kept_run_was_stopped(fanout: Db) -> None:
    """An operator failed the kept run before any of its tasks ran: the dry run says the duplicate
    would be left alone (not "would fail the run"), and writes nothing."""
    action = fanout.actions(Mode.DRY_RUN)[0]
    sql(fanout.url, "UPDATE dag_run SET state = 'failed', end_date = now() WHERE run_id = :r", r=action.kept_run_id)
    sql(fanout.url, "UPDATE task_instance SET state = 'skipped' WHERE run_id = :r", r=action.kept_run_id)
    before = db_state(fanout.url)
    dry = build_remediator(
        Config.of(database_url=fanout.url, remediation="dry-run"), fanout.engine, fanout.db.tables, None
    )
    result = dry.execute(action)
    refused = f"refused: the kept run {action.kept_run_id} was stopped before any task ran, state failed"
    assert (result.result, result.detail) == (Result.SKIPPED, f"{refused}; this run is left alone")
    assert db_state(fanout.url) == before


def test_an_action_of_another_mode_than_configured_is_refused(fanout: Db) -> None:
    action = replace(fanout.actions(Mode.FAIL)[0], mode=Mode.SKIP)
    before = db_state(fanout.url)
    remediator, metrics = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables))
    with capture_logs() as logs:
        result = remediator.execute(action)
    detail = "refused: outcome remediate, mode skip, configured fail"
    assert result == RemediationResult(action, Result.SKIPPED, detail)
    assert logs == [_line(action, result, "warning", mode="skip")]
    assert db_state(fanout.url) == before
    labels = {"mode": "skip", "backend": "db", "result": "skipped"}
    assert metrics.registry.get_sample_value("dupguard_remediations_total", labels) == 1


def test_a_task_that_had_already_finished_makes_the_stop_caught_after_start(fanout: Db) -> None:
    """``DUPGUARD_REMEDIATE_STARTED`` and a task of the duplicate that ran and succeeded before the
    re-read: the write leaves it as it is (finished), stops the rest, and the result still says the
    duplicate's work had started (never ``done``: both runs executed), naming that task."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='success', start_date=now() - interval '5 seconds', end_date=now()"
        " WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    backend = DbBackend(fanout.engine, fanout.db.tables, remediate_started=True)
    remediator, metrics = _remediator(fanout, backend, remediate_started=True)
    with capture_logs() as logs:
        result = remediator.execute(action)
    detail = (
        "caught after start: run -> failed; skipped: load, but task(s) had started before the write landed:"
        " extract (success -> success)"
    )
    assert (result.result, result.detail) == (Result.CAUGHT_AFTER_START, detail)
    assert result.started_tasks == (StartedTask("extract", -1, "success", "success"),)
    assert logs == [_line(action, result, "warning", started_tasks=["extract (success -> success)"])]
    assert _counted(metrics, "caught_after_start") == 1


@pytest.mark.parametrize("mode", [Mode.DRY_RUN, Mode.OFF])
def test_an_action_of_a_mode_that_never_writes_is_refused_even_with_a_backend(fanout: Db, mode: Mode) -> None:
    """Defence in depth: ``build_remediator`` wires no backend for off and dry-run, but an executor
    that has one anyway (a wiring slip) still writes only fail and skip actions: nothing lands."""
    action = replace(fanout.actions(Mode.FAIL)[0], mode=mode)
    before = db_state(fanout.url)
    remediator = GuardedRemediator(
        configured_mode=mode,
        backend=DbBackend(fanout.engine, fanout.db.tables),
        engine=fanout.engine,
        tables=fanout.db.tables,
        metrics=None,
    )
    result = remediator.execute(action)
    detail = f"refused: outcome remediate, mode {mode}, configured {mode}"
    assert result == RemediationResult(action, Result.SKIPPED, detail)
    assert db_state(fanout.url) == before


def test_a_kept_run_stopped_before_the_attempt_is_refused_before_the_backend_is_called(fanout: Db) -> None:
    """An operator failed the kept run before any of its tasks ran, before the attempt: the unlocked
    re-read refuses (the backend is never asked, so the detail has no "(re-checked under lock)"),
    logged as a refusal, and nothing is written."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, "UPDATE dag_run SET state = 'failed', end_date = now() WHERE run_id = :r", r=action.kept_run_id)
    sql(fanout.url, "UPDATE task_instance SET state = 'skipped' WHERE run_id = :r", r=action.kept_run_id)
    before = db_state(fanout.url)
    remediator, metrics = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables))
    with capture_logs() as logs:
        result = remediator.execute(action)
    detail = (
        f"refused: the kept run {action.kept_run_id} was stopped before any task ran, state failed;"
        " this run is left alone"
    )
    assert result == RemediationResult(action, Result.SKIPPED, detail)
    assert logs == [_line(action, result, "warning")]
    assert _counted(metrics, "skipped") == 1
    assert db_state(fanout.url) == before


def test_by_default_the_executor_leaves_a_started_duplicate_alone_before_the_backend(fanout: Db) -> None:
    """``remediate_started`` is off unless asked for: a task of the duplicate running by the re-read
    makes it too late there, before the backend is asked (no "(re-checked under lock)")."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    before = db_state(fanout.url)
    remediator, _ = _remediator(fanout, DbBackend(fanout.engine, fanout.db.tables))
    result = remediator.execute(action)
    detail = "too late, both runs executed: tasks already started (extract=running)"
    assert result == RemediationResult(action, Result.TOO_LATE, detail)
    assert db_state(fanout.url) == before

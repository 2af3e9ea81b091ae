"""Airflow's own asset-event views after dupguard stops a duplicate (apache/airflow#71360).

Airflow 3.0.6-3.3.2 answer HTTP 500 for any asset event whose triggered runs include a run with no
``start_date`` (``DagRunAssetReference.start_date`` is required). For each version, on a real API
server and Airflow-made duplicates: stop every duplicate with each backend, let Airflow's own
scheduler code start the kept runs (``start_queued_runs``), then read the views on-call opens —
``GET /api/v2/assets/events`` and each run's ``upstreamAssetEvents``.

- ``db``: the stopped duplicate gets ``start_date`` = ``end_date``; every view answers 200 and the
  events list the kept run and the duplicate.
- the default (``auto``), dupguard reading the database as a role with the db backend's grants: it
  takes ``db``, so the default does no harm to these views.
- ``api``: no public endpoint can set a run's ``start_date`` (``DAGRunPatchBody`` is state and note
  only, 3.0.6-3.3.2), so Airflow's set-failed leaves it NULL and the events list answers 500: the
  documented limit (docs/explanation/remediation.md), asserted so that a change in Airflow shows here.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import make_url, text
from structlog.testing import capture_logs

from detector.actions.alerts.group_text import status_of
from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import GuardedRemediator, RunStates
from detector.actions.remediation.readback import NO_START_DATE
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, Outcome, plan
from detector.core.ports import Result
from detector.errors import ConfigError, DatabaseError
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.run_state import KeptRun, RunState
from detector.metrics import Metrics
from tests.airflow_server import AirflowServer, CountingProxy, airflow_api_server, start_queued_runs
from tests.pg import Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

# One Airflow-made scenario with a confirmed duplicate per version: the 3.0/3.1 race (three pairs,
# one shared event each), 3.2's partitioned race (one shared event) and 3.3's split OR partition.
SCENARIOS = {
    "3.0.6": "race_asset_fanout",
    "3.1.2": "race_asset_fanout",
    "3.2.2": "race_partitioned",
    "3.3.2": "split_or",
}


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def server(
    request: pytest.FixtureRequest, pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowServer]:
    version = str(request.param)
    with airflow_api_server(version, [SCENARIOS[version]], pg_templates, tmp_path_factory.mktemp(version)) as live:
        yield live


def _call(server: AirflowServer, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """One request to the server (a token first, as any client): its status and its JSON (else text)."""
    headers = {"Content-Type": "application/json"}
    if path != "/auth/token":
        headers["Authorization"] = "Bearer " + _call(server, "POST", "/auth/token", USER)[1]["access_token"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = conn.getresponse()
        data = answer.read().decode(errors="replace")
    finally:
        conn.close()
    return answer.status, json.loads(data) if answer.status < 300 else data


USER = {"username": "admin", "password": "admin"}


def _stop_duplicates(server: AirflowServer, backend: str | None) -> list[tuple[str, str, str]]:
    """Every confirmed duplicate failed by ``backend`` (None: the default): (dag_id, kept run_id, stopped run_id)."""
    url = server.reset(SCENARIOS[server.version])
    engine = make_engine(parse_url(url))
    remediator: GuardedRemediator | None = None
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        actions = [a for a in plan(scan(db, now=now).findings, Mode.FAIL, now=now) if a.outcome is Outcome.REMEDIATE]
        assert actions
        settings = {
            "database_url": url,
            "remediation": "fail",
            "airflow_api_url": server.url,
            "airflow_username": "admin",
            "airflow_password": "admin",
        } | ({"remediation_backend": backend} if backend else {})
        made = build_remediator(Config.of(**settings), engine, db.tables, Metrics())
        assert isinstance(made, GuardedRemediator)
        remediator = made
        for action in actions:
            result = remediator.execute(action)
            assert result.result is Result.DONE, result.detail
            assert (NO_START_DATE in result.detail) is (backend == "api")  # the alert tells on-call
        return [(a.dag_id, a.kept_run_id, a.run.run_id) for a in actions]
    finally:
        if remediator is not None:
            remediator.close()
        engine.dispose()


def _start_dates(url: str) -> dict[str, tuple[str, datetime | None, datetime | None]]:
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT run_id, state, start_date, end_date FROM dag_run"))
            return {r.run_id: (r.state, r.start_date, r.end_date) for r in rows}
    finally:
        engine.dispose()


def _runs_of_events(events: list[dict[str, Any]]) -> set[str]:
    return {str(run["run_id"]) for event in events for run in event.get("created_dagruns") or []}


@pytest.mark.parametrize("backend", ["db", "api", None], ids=["db", "api", "default"])
def test_asset_event_views_after_a_stop(server: AirflowServer, backend: str | None) -> None:
    stopped = _stop_duplicates(server, backend)
    running = {run_id for _, run_id in start_queued_runs(server.version, server.db_url)}
    runs = _start_dates(server.db_url)
    for _, kept, duplicate in stopped:
        assert kept in running and runs[duplicate][0] == "failed"
    status, events = _call(server, "GET", "/api/v2/assets/events?limit=100")

    if backend == "api":
        # The public API cannot set start_date: the stopped duplicate keeps NULL, Airflow answers 500.
        assert all(runs[duplicate][1] is None for _, _, duplicate in stopped)
        assert status == 500, events
        assert "start_date" in server.log_tail(200)
        return

    for _, _, duplicate in stopped:  # db, and the default
        _, start, end = runs[duplicate]
        assert start is not None and start == end  # ended without starting: started and ended at once
    assert status == 200, events
    listed = _runs_of_events(events["asset_events"])
    for dag_id, kept, duplicate in stopped:
        assert {kept, duplicate} <= listed
        for run_id in (kept, duplicate):
            path = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/upstreamAssetEvents"
            status, upstream = _call(server, "GET", path)
            assert status == 200, upstream
            assert upstream["asset_events"], f"{run_id} consumed no event"


def test_the_default_on_a_role_without_the_db_grants_says_why(server: AirflowServer) -> None:
    """A read-only role: the default falls back to the api backend, and one start-up line names the
    missing grant, the harm and the way out; without API settings it refuses to start instead."""
    url = server.reset(SCENARIOS[server.version])
    role = f"dupguard_ro_{uuid.uuid4().hex[:12]}"
    admin = make_engine(parse_url(url))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"))
    read_only = make_url(url).set(username=role).render_as_string(hide_password=False)
    engine = make_engine(parse_url(read_only))
    try:
        db = open_airflow_db(engine)
        api = {"airflow_api_url": server.url, "airflow_username": "admin", "airflow_password": "admin"}
        with capture_logs() as logs:
            made = build_remediator(
                Config.of(database_url=read_only, remediation="fail", **api), engine, db.tables, None
            )
        made.close()
        assert made.backend_name == "api"
        lines = [e for e in logs if e["event"] == "remediation_backend_auto_api"]
        assert len(lines) == 1, logs
        said = lines[0]["reason"]
        assert "lacks UPDATE on dag_run, UPDATE on task_instance, INSERT on dag_run_note" in said
        assert "apache/airflow#71360" in said and "GRANT" in said and "docs/how-to/guard.md" in said
        with pytest.raises(ConfigError, match="needs DUPGUARD_AIRFLOW_API_URL"):
            build_remediator(Config.of(database_url=read_only, remediation="fail"), engine, db.tables, None)
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))
        admin.dispose()


# --- proof behind `done` with the api backend, on the same servers ---------------------


def _api_remediator(server: AirflowServer, url: str, api_url: str) -> tuple[GuardedRemediator, Action]:
    engine = make_engine(parse_url(url))
    db = open_airflow_db(engine)
    now = datetime.now(UTC)
    action = next(a for a in plan(scan(db, now=now).findings, Mode.FAIL, now=now) if a.outcome is Outcome.REMEDIATE)
    settings = {
        "database_url": url,
        "remediation": "fail",
        "remediation_backend": "api",
        "airflow_api_url": api_url,
        "airflow_username": "admin",
        "airflow_password": "admin",
    }
    remediator = build_remediator(Config.of(**settings), engine, db.tables, Metrics(), backoff=0.05)
    assert isinstance(remediator, GuardedRemediator)
    return remediator, action


class _ReadBackFails:
    """The backend's read-back source, failing once Airflow has been sent the PATCH (the database or
    the API unreachable right then); the guard's own re-read before the write is untouched."""

    def __init__(self, inner: RunStates, proxy: CountingProxy) -> None:
        self.inner, self.proxy = inner, proxy

    def _sent(self) -> bool:
        return any(m == "PATCH" for m, _ in self.proxy.requests)

    def state(self, action: Action) -> RunState | None:
        if self._sent():
            raise DatabaseError("database unreachable (test)")
        return self.inner.state(action)

    def note(self, action: Action) -> str | None:
        return self.inner.note(action)

    def kept(self, action: Action) -> KeptRun | None:
        return self.inner.kept(action)


def _counted(remediator: GuardedRemediator, result: str) -> float | None:
    assert remediator.metrics is not None
    labels = {"mode": "fail", "backend": "api", "result": result}
    return remediator.metrics.registry.get_sample_value("dupguard_remediations_total", labels)


def test_a_stop_whose_read_back_failed_is_unknown_not_done(server: AirflowServer) -> None:
    """Airflow applied the PATCH, then the read-back failed: nothing proves the stop held or that no
    task had started, so the result is ``unknown`` (counted and shown so), never ``done``."""
    url = server.reset(SCENARIOS[server.version])
    with CountingProxy(server.port) as proxy:
        remediator, action = _api_remediator(server, url, proxy.url)
        try:
            backend = remediator.backend
            assert isinstance(backend, ApiBackend)
            backend.states = _ReadBackFails(backend.states, proxy)
            result = remediator.execute(action)
        finally:
            remediator.close()
    assert _start_dates(url)[action.run.run_id][0] == "failed"  # Airflow did apply it
    assert result.result is Result.UNKNOWN, result.detail
    assert "read-back failed" in result.detail and "database unreachable" in result.detail
    assert _counted(remediator, "unknown") == 1 and _counted(remediator, "done") is None
    assert status_of([result]).name == "unknown"


def test_a_run_stopped_by_someone_else_after_our_failed_attempt_is_already_with_who(server: AirflowServer) -> None:
    """Our PATCH is answered 503 (never applied) while an operator fails the run through Airflow's API
    with a note of their own: ``already``, quoting that note, not ``done``."""
    url = server.reset(SCENARIOS[server.version])
    with CountingProxy(server.port) as proxy:
        remediator, action = _api_remediator(server, url, proxy.url)
        path = f"/api/v2/dags/{quote(action.dag_id, safe='')}/dagRuns/{quote(action.run.run_id, safe='')}"
        by_hand = {"state": "failed", "note": "stopped by on-call (INC-7)"}

        def operator_fails_it() -> None:
            status, answer = _call(server, "PATCH", path, by_hand)
            assert status == 200, answer

        proxy.hooks.append(("PATCH /api/v2/dags/", operator_fails_it))
        proxy.inject.append(("/api/v2/dags/", 503, 0.0))
        try:
            result = remediator.execute(action)
        finally:
            remediator.close()
    assert _start_dates(url)[action.run.run_id][0] == "failed"
    assert result.result is Result.ALREADY, result.detail
    assert "not stopped by dupguard's write" in result.detail and "INC-7" in result.detail
    assert _counted(remediator, "already") == 1 and _counted(remediator, "done") is None

"""Backend ``api`` against a real Airflow 3.0.6 API server, on duplicates made by 3.0.6's own scheduler code.

``skip`` through the API is refused on 3.0 (its scheduler can undo it); ``fail`` is one PATCH per
run. A ``CountingProxy`` in front of the server records which endpoints were used; the database
shows what they did. One server for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pytest

from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import DbRunStates, GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, plan
from detector.core.ports import Result, StartedTask
from detector.errors import ConfigError
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.schema import Family
from detector.metrics import Metrics
from tests.airflow_server import (
    AirflowServer,
    CountingProxy,
    airflow_api_server,
    db_state,
    start_task,
    warm_execution_api,
)
from tests.pg import Templates, ground_truth

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

VERSION = "3.0.6"
FANOUT = "race_asset_fanout"  # 3 consumer DAGs, a duplicate pair each (extract >> load), nothing started


@pytest.fixture(scope="module")
def af306(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    with airflow_api_server(VERSION, [FANOUT], pg_templates, tmp_path_factory.mktemp("af306")) as server:
        yield server


class Live:
    def __init__(self, server: AirflowServer) -> None:
        self.server = server
        self.url = server.reset(FANOUT)
        self.engine = make_engine(parse_url(self.url))
        self.db = open_airflow_db(self.engine)
        self.made: list[GuardedRemediator] = []

    def actions(self, mode: Mode) -> list[Action]:
        now = datetime.now(UTC)
        return plan(scan(self.db, now=now).findings, mode, now=now)

    def remediator(self, mode: Mode, api_url: str, **overrides: Any) -> GuardedRemediator:
        config = Config.of(
            database_url=self.url,
            remediation=mode.value,
            remediation_backend=overrides.pop("remediation_backend", "api"),
            airflow_api_url=api_url,
            airflow_username="admin",
            airflow_password="admin",
            **overrides,
        )
        remediator = build_remediator(config, self.engine, self.db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        assert isinstance(remediator.backend, ApiBackend) and isinstance(remediator.backend.states, DbRunStates)
        assert remediator.backend.states.tables.family is Family.AIRFLOW_3_0
        self.made.append(remediator)
        return remediator

    def close(self) -> None:
        for remediator in self.made:
            remediator.close()
        self.engine.dispose()


@pytest.fixture
def live(af306: AirflowServer) -> Iterator[Live]:
    harness = Live(af306)
    yield harness
    harness.close()


def _patches(proxy: CountingProxy) -> list[str]:
    """Every PATCH path the proxy forwarded (URL-decoded), one entry per request."""
    return sorted(unquote(p) for (m, p), n in proxy.requests.items() if m == "PATCH" for _ in range(n))


def _unchanged_except(before: dict[str, Any], after: dict[str, Any], targets: set[str]) -> None:
    assert before.keys() == after.keys()
    for run_id, row in before.items():
        if run_id not in targets:
            assert after[run_id] == row, f"{run_id} changed but was not a target"


def _kept_runs_are_the_first_ones(actions: list[Action]) -> None:
    truth = ground_truth(VERSION, FANOUT)
    assert sorted(a.kept_run_id for a in actions) == sorted(g["first_run_id"] for g in truth["expected_groups"])


def test_skip_through_the_api_is_refused_on_3_0(live: Live) -> None:
    """3.0.6's schedule_tis also sets SCHEDULED by id without a state check (dagrun.py L1990), so a
    skip through the API could be undone: refused at start-up, nothing sent, nothing changed."""
    before = db_state(live.url)
    with CountingProxy(live.server.port) as proxy:
        with pytest.raises(ConfigError, match=r"refused on Airflow 3\.0"):
            live.remediator(Mode.SKIP, proxy.url)
        assert sum(proxy.requests.values()) == 0
    assert db_state(live.url) == before


def test_a_task_started_between_the_re_read_and_the_patch_is_caught_after_start_on_3_0(live: Live) -> None:
    """As on 3.1.2: a worker starts extract through 3.0.6's Execution API after the guard's re-read;
    the PATCH's set-failed stops it; the result is caught_after_start naming it."""
    action = live.actions(Mode.FAIL)[0]
    warm_execution_api(live.server)
    with CountingProxy(live.server.port) as proxy:
        proxy.hooks.append(
            ("/api/v2/dags/", lambda: start_task(live.server, action.dag_id, action.run.run_id, "extract"))
        )
        # The hook (a worker starting the task) runs inside the PATCH's time: a generous timeout.
        result = live.remediator(Mode.FAIL, proxy.url, airflow_timeout=timedelta(seconds=60)).execute(action)
    row = db_state(live.url)[action.run.run_id]
    assert row.state == "failed" and row.tasks["extract"][0] == "failed" and row.tasks["load"][0] == "skipped"
    assert result.result is Result.CAUGHT_AFTER_START, result.detail
    assert result.started_tasks == (StartedTask("extract", -1, None, "failed"),)


def test_fail_on_3_0_marks_the_duplicate_failed_and_notes_it(live: Live) -> None:
    """fail on 3.0: one PATCH per run; run failed, its unstarted TIs skipped, note set; kept run untouched."""
    actions = live.actions(Mode.FAIL)
    before = db_state(live.url)
    with CountingProxy(live.server.port) as proxy:
        results = [live.remediator(Mode.FAIL, proxy.url).execute(a) for a in actions]
        patches = _patches(proxy)
    after = db_state(live.url)

    assert [r.result for r in results] == [Result.DONE] * 3, [r.detail for r in results]
    assert patches == sorted(f"/api/v2/dags/{a.dag_id}/dagRuns/{a.run.run_id}" for a in actions)
    for action in actions:
        row = after[action.run.run_id]
        assert row.state == "failed" and row.end_date is not None
        assert {name: ti[0] for name, ti in row.tasks.items()} == {"extract": "skipped", "load": "skipped"}
        assert row.note == action.note and "dupguard stopped this run" in row.note
        assert row.note_user == "admin"
        kept = after[action.kept_run_id]
        assert kept == before[action.kept_run_id] and kept.state == "queued" and kept.note is None
    _unchanged_except(before, after, {a.run.run_id for a in actions})
    _kept_runs_are_the_first_ones(actions)

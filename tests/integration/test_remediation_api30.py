"""Backend ``api`` against a real Airflow 3.0.6 API server, on duplicates made by 3.0.6's own scheduler code.

3.0 has no bulk task-instance endpoint: ``skip`` sends one ``PATCH …/taskInstances/{task_id}`` per
unfinished TI, then the note. A ``CountingProxy`` in front of the server records which endpoints
were used; the database shows what they did. One server for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

import pytest

from detector.config import Config
from detector.db import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from detector.plan import Action, Mode, Outcome, plan
from detector.ports import Result
from detector.remediation import GuardedRemediator, build_remediator
from detector.remediation_api import ApiBackend
from detector.scan import scan
from detector.schema import Family
from tests.airflow_server import AirflowServer, CountingProxy, airflow_api_server, db_state
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

    def remediator(self, mode: Mode, api_url: str) -> GuardedRemediator:
        config = Config.of(
            database_url=self.url,
            remediation=mode.value,
            airflow_api_url=api_url,
            airflow_username="admin",
            airflow_password="admin",
        )
        remediator = build_remediator(config, self.engine, self.db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        assert isinstance(remediator.backend, ApiBackend) and remediator.backend.family is Family.AIRFLOW_3_0
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


def test_skip_patches_each_task_instance_on_3_0_and_notes_the_run(live: Live) -> None:
    """skip on 3.0: one PATCH per unfinished TI (no bulk endpoint), then the note; every TI of the
    duplicate skipped, its run state left to the scheduler, the kept run untouched."""
    actions = live.actions(Mode.SKIP)
    assert len(actions) == 3 and all(a.outcome is Outcome.REMEDIATE for a in actions)
    _kept_runs_are_the_first_ones(actions)
    before = db_state(live.url)
    for a in actions:
        assert {ti[0] for ti in before[a.run.run_id].tasks.values()} <= {None, "scheduled", "queued"}

    with CountingProxy(live.server.port) as proxy:
        results = [live.remediator(Mode.SKIP, proxy.url).execute(a) for a in actions]
        patches = _patches(proxy)
    after = db_state(live.url)

    assert [r.result for r in results] == [Result.DONE] * 3, [r.detail for r in results]
    expected = []
    for a in actions:
        run = f"/api/v2/dags/{a.dag_id}/dagRuns/{a.run.run_id}"
        expected += [run, f"{run}/taskInstances/extract", f"{run}/taskInstances/load"]
    assert patches == sorted(expected)  # per-TI PATCHes and the note; no bulk …/taskInstances call
    for action in actions:
        row = after[action.run.run_id]
        assert {name: ti[0] for name, ti in row.tasks.items()} == {"extract": "skipped", "load": "skipped"}
        assert all(ti[2] is not None for ti in row.tasks.values())  # end_date set by Airflow
        assert row.state == before[action.run.run_id].state == "queued"
        assert row.note == action.note and row.note_user == "admin"
        kept = after[action.kept_run_id]
        assert kept == before[action.kept_run_id] and kept.note is None
        assert {ti[0] for ti in kept.tasks.values()} <= {None, "scheduled", "queued"}
    _unchanged_except(before, after, {a.run.run_id for a in actions})


def test_second_skip_on_3_0_is_already_and_sends_nothing(live: Live) -> None:
    action = live.actions(Mode.SKIP)[0]
    with CountingProxy(live.server.port) as proxy:
        remediator = live.remediator(Mode.SKIP, proxy.url)
        assert remediator.execute(action).result is Result.DONE
        after_first = db_state(live.url)
        sent = sum(proxy.requests.values())
        again = remediator.execute(action)
        assert sum(proxy.requests.values()) == sent
    assert again.result is Result.ALREADY
    assert db_state(live.url) == after_first


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

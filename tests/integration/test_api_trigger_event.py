"""The trigger_event kind through the REST source (``--source api``), on real Airflow API servers
serving the databases Airflow's own code made (scripts/airflow/scenarios_trigger_event.py), whose
queued runs Airflow's scheduler code then started (their events are unreadable before,
apache/airflow#71360). The truth is the fixture's json (which message each event carried, which run
consumed it), never dupguard's rule; the database source's scan of the same database must agree."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import ExitStack, redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from detector.app.cli import main
from tests.airflow_server import AirflowServer, CountingProxy, airflow_api_server, db_state, start_queued_runs
from tests.integration.test_api_source import _env, _events, _once, scan_api
from tests.pg import Templates, database_url, ground_truth, scenarios

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

AFFECTED, FIXED = ["3.0.6", "3.1.2"], "3.2.2"
CASES = [(v, s) for v in [*AFFECTED, FIXED] for s in scenarios(v) if s.startswith("trigger_event_")]
FIELDS = ("key", "kind", "confidence", "kept_run_id", "duplicate_run_ids", "shared_event_ids", "run_after")


class _Servers:
    """An API server per version, started when a test first asks for it (with that version's
    trigger_event fixtures, runs started by Airflow's code), one at a time, stopped with the module."""

    def __init__(self, templates: Templates, factory: pytest.TempPathFactory, stack: ExitStack) -> None:
        self.templates, self.factory, self.stack = templates, factory, stack
        self.started: dict[str, AirflowServer] = {}

    def __getitem__(self, version: str) -> AirflowServer:
        if version not in self.started:
            names = [s for v, s in CASES if v == version]
            home = self.factory.mktemp(f"af-te-{version}")
            server = self.stack.enter_context(airflow_api_server(version, names, self.templates, home))
            start_queued_runs(version, *(database_url(server.sources[name]) for name in names))
            self.started[version] = server
        return self.started[version]


@pytest.fixture(scope="module")
def servers(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Servers]:
    with ExitStack() as stack:
        yield _Servers(pg_templates, tmp_path_factory, stack)


@pytest.fixture
def creds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUPGUARD_AIRFLOW_USERNAME", "admin")
    monkeypatch.setenv("DUPGUARD_AIRFLOW_PASSWORD", "admin")
    monkeypatch.delenv("DUPGUARD_DATABASE_URL", raising=False)


def _truth(version: str, scenario: str) -> list[tuple[str, str, str, tuple[str, ...], list[int]]]:
    # Its suspected_groups are equal payloads without a message id: they link no runs (core.trigger_event,
    # 8474eed), no group from either source; the database source's trigger_flapping check reports them as
    # a suspected observation (ebbe4a9), from Airflow's trigger and job tables: not readable through the API.
    groups = ground_truth(version, scenario)["expected_groups"]
    return sorted(
        (
            g["kind"],
            g["confidence"],
            g["first_run_id"],
            tuple(r for r in g["run_ids"] if r != g["first_run_id"]),
            sorted(g["shared_event_ids"]),
        )
        for g in groups
    )


def _found(doc: dict[str, Any]) -> list[tuple[str, str, str, tuple[str, ...], list[int]]]:
    return sorted(
        (g["kind"], g["confidence"], g["kept_run_id"], tuple(g["duplicate_run_ids"]), sorted(g["shared_event_ids"]))
        for g in doc["groups"]
    )


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_scan_through_the_api_finds_exactly_the_truths_groups(
    servers: _Servers, creds: None, version: str, scenario: str
) -> None:
    """`scan --source api --format json`: the truth's trigger_event groups (the run the first copy made
    kept, the copies' events shared) on 3.0.6 and 3.1.2, nothing on 3.2.2's clean run and on the
    look-alikes; the same groups, keys and events as `scan --source database` of the same database."""
    server = servers[version]
    url = server.reset(scenario)
    _, doc = scan_api(server.url)
    assert doc["source"] == "api" and doc["airflow_version"] == version
    assert _found(doc) == _truth(version, scenario)
    out = io.StringIO()
    with redirect_stdout(out):
        main(["scan", "--database-url", url, "--format", "json"])
    by_db = json.loads(out.getvalue())
    assert [{f: g[f] for f in FIELDS} for g in doc["groups"]] == [{f: g[f] for f in FIELDS} for g in by_db["groups"]]


def _duplicates(version: str, scenario: str) -> dict[str, str]:
    return {
        r: g["first_run_id"]
        for g in ground_truth(version, scenario)["expected_groups"]
        for r in g["run_ids"]
        if r != g["first_run_id"]
    }


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_run_once_through_the_api_alerts_each_group_once(
    servers: _Servers, tmp_path: Path, version: str, scenario: str
) -> None:
    """`run --once --source api` (the daemon's poll, dry-run): one duplicate_detected per truth group,
    kind trigger_event, the first copy's run kept, the plan naming the duplicate; nothing on the
    look-alikes. A second run with the same state file alerts nothing again. Each trigger-made run
    costs its events read and, for a message id, one events list of its asset (here: at most one)."""
    server = servers[version]
    server.reset(scenario)
    state = tmp_path / "state.json"
    with CountingProxy(server.port) as proxy:
        code, out = _once(_env(proxy.url, state))
        assert code == 0, out
        near = [p for _, p in proxy.requests if p.startswith("/api/v2/assets/events")]
    detected = _events(out, "duplicate_detected")
    assert {r: e["kept_run"] for e in detected for r in e["duplicate_runs"]} == _duplicates(version, scenario)
    assert all(e["kind"] == "trigger_event" for e in detected)
    assert len(near) <= 1, near  # the first poll judges the DAG's runs together: one range of the asset
    code, again = _once(_env(server.url, state))
    assert code == 0 and _events(again, "duplicate_detected") == []


def test_run_once_fails_the_extra_run_through_the_api(servers: _Servers, tmp_path: Path) -> None:
    """remediation=fail through the API on 3.1.2: the run the second copy made is failed with the note
    naming the kept run; the first copy's run is untouched."""
    server = servers["3.1.2"]
    url = server.reset("trigger_event_two_runs")
    [dup] = _duplicates("3.1.2", "trigger_event_two_runs")
    kept = _duplicates("3.1.2", "trigger_event_two_runs")[dup]
    before = db_state(url)
    code, out = _once(_env(server.url, tmp_path / "state.json", DUPGUARD_REMEDIATION="fail"))
    assert code == 0, out
    after = db_state(url)
    note = after[dup].note
    assert after[dup].state == "failed" and note is not None and kept in note
    assert after[kept] == before[kept]


@pytest.mark.parametrize("version", AFFECTED)
def test_scan_through_the_api_proves_a_custom_id_the_setting_names(
    servers: _Servers, creds: None, version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trigger_event_custom_id: the id at the payload's meta.id, named by DUPGUARD_MESSAGE_ID_PATHS (the
    asset's name as the API serves it with each event), proves the copies: the truth's confirmed group."""
    truth = ground_truth(version, "trigger_event_custom_id")
    server = servers[version]
    server.reset("trigger_event_custom_id")
    monkeypatch.setenv("DUPGUARD_MESSAGE_ID_PATHS", truth["message_id_paths"])
    _, doc = scan_api(server.url)
    expected = sorted(
        (g["kind"], g["confidence"], g["first_run_id"], tuple(g["extra_run_ids"]), sorted(g["shared_event_ids"]))
        for g in truth["expected_groups_with_message_id_paths"]
    )
    assert expected and _found(doc) == expected

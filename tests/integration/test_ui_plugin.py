"""dupguard's Airflow UI plugin ("HA health", detector/guard/ui_plugin.py) in a real Airflow API server.

The airflow-dupguard-guard wheel is built from deploy/airflow-guard and put on the server's path, so
Airflow finds the plugin by its ``airflow.plugins`` entry point, as in an image where the package is
installed; the pages run this worktree's ``dupguard scan``/``doctor`` (``DUPGUARD_UI_COMMAND``) on an
Airflow-made duplicate: the 3.1 race (race_asset) and a 3.3 partitioned split (split_or).

Auth: the simple auth manager's admin and viewer, and ``outsider``, who may read every DAG but the
finding's (tests/fixtures/ui_plugin/dag_scoped_auth_manager.py). The browser half is
test_ui_plugin_browser.py.
"""

from __future__ import annotations

import contextlib
import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.airflow_server import USERS, AirflowServer, airflow_api_server, scenario_path, sql
from tests.guard.support import build_guard_site
from tests.pg import FIXTURES, ROOT, Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

CASES = {"3.1.2": "race_asset", "3.3.2": "split_or"}
PASSWORDS = {**USERS, "outsider": "outsider"}


@dataclass
class UiServer:
    server: AirflowServer
    dag_id: str
    kept: str
    duplicate: str

    def get(self, path: str, user: str | None = None, *, cookie: bool = False) -> tuple[int, str]:
        headers = {}
        if user is not None:
            token = login(self.server, user)
            headers = {"Cookie": f"_token={token}"} if cookie else {"Authorization": f"Bearer {token}"}
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        try:
            conn.request("GET", path, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.read().decode()
        finally:
            conn.close()

    def run_path(self, run_id: str) -> str:
        return f"/dupguard/runs/{quote(self.dag_id, safe='')}/{quote(run_id, safe='')}"


def login(server: AirflowServer, user: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        body = json.dumps({"username": user, "password": PASSWORDS[user]})
        conn.request("POST", "/auth/token", body=body, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        data = answer.read()
        assert answer.status in (200, 201), data
        token: str = json.loads(data)["access_token"]
        return token
    finally:
        conn.close()


@contextlib.contextmanager
def ui_server(version: str, templates: Templates, work: Path, **env: str) -> Iterator[UiServer]:
    """A real API server of ``version`` with the plugin installed, on ``CASES[version]``'s database."""
    scenario = CASES[version]
    expected = json.loads(scenario_path(version, scenario).with_suffix(".json").read_text())["expected_groups"][0]
    passwords = work / "ui-passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    site = build_guard_site(work)
    environ = {
        "PYTHONPATH": f"{site}:{FIXTURES / 'ui_plugin'}",
        "AIRFLOW__CORE__AUTH_MANAGER": "dag_scoped_auth_manager.DagScopedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer,outsider:viewer",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "DUPGUARD_TEST_DENIED_DAG": expected["dag_id"],
        "DUPGUARD_UI_COMMAND": str(ROOT / ".venv" / "bin" / "dupguard"),
        "DUPGUARD_UI_SINCE": "3650d",  # the fixtures were made on one day; any age passes
        **env,
    }
    with airflow_api_server(version, [scenario], templates, work, env=environ) as server:
        runs = expected["run_ids"]
        kept = expected["first_run_id"]
        yield UiServer(server, expected["dag_id"], kept, next(r for r in runs if r != kept))


@pytest.fixture(scope="module", params=sorted(CASES))
def ui(
    request: pytest.FixtureRequest, pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[UiServer]:
    version: str = request.param
    with ui_server(version, pg_templates, tmp_path_factory.mktemp(f"ui-{version}")) as server:
        yield server


def test_the_entry_point_registers_both_views(ui: UiServer) -> None:
    """Airflow lists the plugin found by its entry point, with the nav page and the run tab."""
    status, body = ui.get("/api/v2/plugins", "admin")
    assert status == 200, body
    (plugin,) = [p for p in json.loads(body)["plugins"] if p["name"] == "dupguard"]
    views = {v["destination"]: v for v in plugin["external_views"]}
    assert views["nav"]["href"] == "/dupguard/health"
    assert views["dag_run"]["href"] == "/dupguard/runs/{DAG_ID}/{RUN_ID}"


@pytest.mark.parametrize("path", ["/dupguard/health", "/dupguard/api/findings", "/dupguard/runs/d/r"])
def test_anonymous_requests_are_refused(ui: UiServer, path: str) -> None:
    status, _ = ui.get(path)
    assert status in (401, 403)


def test_a_reader_sees_the_finding_by_the_same_rules_as_scan(ui: UiServer) -> None:
    status, body = ui.get("/dupguard/api/findings", "viewer")
    assert status == 200, body
    (group,) = json.loads(body)["groups"]
    assert (group["dag_id"], group["kept_run_id"], group["duplicate_run_ids"]) == (ui.dag_id, ui.kept, [ui.duplicate])


def test_a_user_who_may_not_read_the_dag_sees_nothing_of_it(ui: UiServer) -> None:
    status, body = ui.get("/dupguard/api/findings", "outsider")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["groups"] == []
    assert all(ui.dag_id not in o["dag_ids"] for found in doc["checks"].values() for o in found)
    status, page = ui.get("/dupguard/health", "outsider")
    assert status == 200
    assert ui.dag_id not in page and ui.kept not in page
    status, _ = ui.get(ui.run_path(ui.duplicate), "outsider")
    assert status == 403


def test_the_run_tab_names_the_kept_run_with_the_cookie_the_ui_sends(ui: UiServer) -> None:
    """The iframe gets the UI's ``_token`` cookie (same origin), not a header."""
    status, page = ui.get(ui.run_path(ui.duplicate), "viewer", cookie=True)
    assert status == 200, page
    assert "is a duplicate of" in page and ui.kept in page
    status, page = ui.get(ui.run_path(ui.kept), "admin", cookie=True)
    assert status == 200
    assert "kept run of a duplicate group" in page and ui.duplicate in page


def test_the_note_on_a_run_is_read_through_the_api_servers_session(ui: UiServer) -> None:
    """What dupguard did comes from the run's note; a note on a run Airflow shows was not stopped is disputed
    (the fixtures' duplicates are queued or running)."""
    sql(
        ui.server.db_url,
        "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) "
        "SELECT id, :note, now(), now() FROM dag_run WHERE dag_id = :dag AND run_id = :run",
        note=f"dupguard stopped this run as a duplicate of {ui.kept} (copied by hand)",
        dag=ui.dag_id,
        run=ui.duplicate,
    )
    try:
        status, page = ui.get(ui.run_path(ui.duplicate), "viewer")
        assert status == 200
        assert "the note is disputed" in page
    finally:
        sql(ui.server.db_url, "DELETE FROM dag_run_note WHERE content LIKE 'dupguard stopped%'")


def test_a_clean_run_shows_that_nothing_was_found(ui: UiServer) -> None:
    status, page = ui.get(ui.run_path("manual__never_a_duplicate"), "admin")
    assert status == 200
    assert "found no duplicate of this run" in page


def test_the_nav_page_filters_by_dag_and_kind_and_shows_the_exposure(ui: UiServer) -> None:
    status, page = ui.get(f"/dupguard/health?dag={quote(ui.dag_id)}", "admin")
    assert status == 200
    assert ui.kept in page and "Exposure (dupguard doctor)" in page and "schedulers alive" in page
    status, page = ui.get("/dupguard/health?dag=no_such_dag", "admin")
    assert ui.kept not in page and "No open finding" in page


def test_no_route_writes(ui: UiServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", ui.server.port, timeout=30)
    try:
        conn.request("POST", "/dupguard/api/findings", headers={"Authorization": f"Bearer {login(ui.server, 'admin')}"})
        assert conn.getresponse().status == 405
    finally:
        conn.close()


def test_switched_off_the_plugin_adds_nothing(pg_templates: Templates, tmp_path: Path) -> None:
    with ui_server("3.3.2", pg_templates, tmp_path, DUPGUARD_UI="off") as ui_off:
        status, body = ui_off.get("/api/v2/plugins", "admin")
        assert status == 200, body
        plugins = {p["name"]: p for p in json.loads(body)["plugins"]}
        assert plugins["dupguard"]["external_views"] == [] and plugins["dupguard"]["fastapi_apps"] == []
        # the path then falls to the UI's own pages (index.html for every unknown path)
        assert "Exposure (dupguard doctor)" not in ui_off.get("/dupguard/health", "admin")[1]

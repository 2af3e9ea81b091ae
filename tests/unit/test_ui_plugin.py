"""The pure half of the UI plugin (detector/guard/ha_health.py): who sees what, what a run's fate reads as.

The plugin in a real Airflow API server is tests/integration/test_ui_plugin.py; in a browser,
tests/integration/test_ui_plugin_browser.py.
"""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from detector.core.decisions import REMEDIATION_NOTE_PREFIX
from detector.core.model import GUARD_NOTE_PREFIX
from detector.guard import ha_health, ha_health_scans

LINKS = ha_health.Links("/airflow/", "/dupguard", "tab")


def _run(run_id: str, *, kept: bool, started: int = 0) -> dict[str, Any]:
    return {"run_id": run_id, "kept": kept, "state": "success", "tasks_started": started, "tasks_total": 1}


def _doc() -> dict[str, Any]:
    group = {
        "key": "k",
        "dag_id": "orders",
        "kind": "asset",
        "confidence": "confirmed",
        "kept_run_id": "r1",
        "duplicate_run_ids": ["r2"],
        "shared_event_ids": [7],
        "creator_hostnames": ["a", None],
        "runs": [_run("r1", kept=True, started=1), _run("r2", kept=False)],
    }
    other = dict(group, dag_id="<secret>", key="k2")
    flap = {"kind": "trigger_flapping", "dag_ids": ["orders", "<secret>"], "title": "t", "lines": [], "advice": "a"}
    mine = dict(flap, dag_ids=["orders"], title="mine")
    return {"groups": [group, other], "checks": {"trigger_flapping": [flap, mine]}, "since": None}


def test_the_note_prefixes_are_the_daemons() -> None:
    """The plugin cannot import the daemon's constants (it runs in Airflow's venv): they must stay equal."""
    assert ha_health.REMEDIATION_NOTE_PREFIX == REMEDIATION_NOTE_PREFIX
    assert ha_health.GUARD_NOTE_PREFIX == GUARD_NOTE_PREFIX


def test_a_user_sees_only_the_dags_they_may_read() -> None:
    seen = ha_health.readable(_doc(), {"orders"})
    assert [g["dag_id"] for g in seen["groups"]] == ["orders"]
    # a check's finding naming a DAG the user may not read is hidden whole
    assert [o["title"] for o in seen["checks"]["trigger_flapping"]] == ["mine"]
    assert ha_health.readable(_doc(), set())["groups"] == []


def test_the_fate_of_a_duplicate_comes_from_its_note_and_what_airflow_recorded() -> None:
    skipped = dict(_run("r", kept=False), state="success")  # the guard's: every task skipped, none started
    failed = dict(_run("r", kept=False), state="failed")
    failed_late = dict(failed, tasks_started=1)
    running = dict(_run("r", kept=False, started=1), state="running")
    assert "guard" in ha_health.what_dupguard_did(skipped, GUARD_NOTE_PREFIX + "r1 (...)")
    assert "before its tasks started" in ha_health.what_dupguard_did(failed, REMEDIATION_NOTE_PREFIX + "r1 (x)")
    assert "too late" in ha_health.what_dupguard_did(failed_late, REMEDIATION_NOTE_PREFIX + "r1 (x)")
    # a note is not proof: a run still running was not stopped, whatever its note says
    assert "disputed" in ha_health.what_dupguard_did(running, REMEDIATION_NOTE_PREFIX + "r1 (x)")
    assert "disputed" in ha_health.what_dupguard_did(dict(skipped, tasks_started=1), GUARD_NOTE_PREFIX + "r1")
    assert ha_health.what_dupguard_did(dict(skipped, state="queued"), "typed").startswith("not stopped yet")
    assert ha_health.what_dupguard_did(running, None).startswith("not stopped: its tasks ran")


def test_the_run_tab_of_a_duplicate_links_the_kept_run_and_escapes_everything() -> None:
    doc = ha_health.readable(_doc(), None)
    page = ha_health.render_run(doc, "<secret>", "r2", {}, LINKS)
    assert "is a duplicate of" in page and "%3Csecret%3E" in page and "<secret>" not in page
    page = ha_health.render_run(doc, "orders", "r1", {}, LINKS)
    assert "kept run of a duplicate group: 1 duplicate" in page
    # in Airflow's frame the link moves Airflow's page to the run's tab; alone it opens the plugin's page
    assert 'href="/airflow/dupguard/runs/orders/r2" data-top="/airflow/dags/orders/runs/r2/plugin/tab"' in page
    assert "found no duplicate" in ha_health.render_run(doc, "orders", "r9", {}, LINKS)


def test_the_nav_page_filters_by_dag_and_kind() -> None:
    doc = ha_health.readable(_doc(), {"orders"})
    every = ha_health.render_nav(doc, None, LINKS)
    assert "duplicate_group" in every and "mine" in every
    only_checks = ha_health.render_nav(doc, None, LINKS, kind="trigger_flapping")
    assert "r1" not in only_checks.split("</form>")[1] and "mine" in only_checks
    assert "No open finding" in ha_health.render_nav(doc, None, LINKS, dag="elsewhere")


def test_a_failed_scan_is_said_on_the_page() -> None:
    page = ha_health.render_nav({"error": {"message": "database unreachable"}}, None, LINKS)
    assert "could not scan: database unreachable" in page and "No open finding" not in page


FAKE_DUPGUARD = """
import json, os, sys, time
calls = os.path.join(os.path.dirname(sys.argv[0]), "calls")
with open(calls, "a") as f:
    f.write(json.dumps([sys.argv[1:], os.environ.get("DUPGUARD_DATABASE_URL")]) + "\\n")
n = sum(1 for _ in open(calls))
time.sleep(float(os.environ.get("FAKE_DELAY" if n > 2 else "FAKE_FIRST_DELAY", "0")))
print(json.dumps({"error": None, "groups": [], "checks": {}, "runs_examined": n}))
"""


def _scans(tmp_path: Path, refresh: float) -> tuple[ha_health_scans.Scans, Path]:
    script = tmp_path / "fake_dupguard.py"
    script.write_text(FAKE_DUPGUARD)
    scans = ha_health_scans.Scans(
        [sys.executable, str(script)],
        since="7d",
        refresh=refresh,
        timeout=30,
        database_url=lambda: "postgresql://u:pw@h/db",
    )
    return scans, tmp_path / "calls"


def test_the_database_url_reaches_dupguard_in_its_environment_only(tmp_path: Path) -> None:
    scans, calls = _scans(tmp_path, refresh=60)
    doc, doctor = scans.documents()
    assert doc["runs_examined"] == 2 and doctor is not None  # scan after doctor: the second call
    lines = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [argv for argv, _ in lines] == [
        ["doctor", "--format", "json"],
        ["scan", "--since", "7d", "--format", "json"],
    ]
    assert all(url == "postgresql://u:pw@h/db" for _, url in lines)
    assert scans.documents()[0] is doc  # fresh: no new scan
    assert len(calls.read_text().splitlines()) == 2


def test_a_stale_answer_is_served_while_the_next_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the first page waits for a scan: later ones answer from memory, however slow the scan."""
    monkeypatch.setenv("FAKE_DELAY", "3")
    scans, _ = _scans(tmp_path, refresh=0)
    first = scans.documents()[0]
    started = time.monotonic()
    assert scans.documents()[0] is first  # stale, refreshing behind
    assert time.monotonic() - started < 1.0
    deadline = time.monotonic() + 20
    while scans.documents()[0] is first and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scans.documents()[0]["runs_examined"] >= 4


def test_before_the_first_scan_is_in_a_page_waits_only_as_long_as_it_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FIRST_DELAY", "2")
    scans, _ = _scans(tmp_path, refresh=60)
    started = time.monotonic()
    assert scans.documents(wait=0.2) is None
    assert time.monotonic() - started < 1.0
    docs = scans.documents()  # no limit: waits for the one scan under way, starts no other
    assert docs is not None and docs[0]["runs_examined"] == 2


def test_a_command_that_cannot_run_is_an_error_on_the_page_without_its_environment(tmp_path: Path) -> None:
    scans = ha_health_scans.Scans(
        [str(tmp_path / "missing")], since="7d", refresh=60, timeout=5, database_url=lambda: "postgresql://u:pw@h/db"
    )
    doc, doctor = scans.documents()
    assert doctor is None
    assert doc["error"]["message"] == f"{tmp_path / 'missing'} scan failed (FileNotFoundError)"


def test_the_guard_package_ships_every_module_of_detector_guard() -> None:
    """deploy/airflow-guard copies the modules in one by one (force-include): a new one left out breaks the
    plugin's import inside Airflow only."""
    root = Path(__file__).resolve().parents[2]
    spec = tomllib.loads((root / "deploy" / "airflow-guard" / "pyproject.toml").read_text())
    targets = spec["tool"]["hatch"]["build"]["targets"]
    modules = sorted(p.name for p in (root / "detector" / "guard").glob("*.py") if p.name != "__init__.py")
    for target in ("wheel", "sdist"):
        shipped = sorted(Path(dest).name for dest in targets[target]["force-include"].values())
        assert shipped == modules, target


def test_the_page_before_the_first_scan_reloads_itself() -> None:
    page = ha_health.render_pending("HA health")
    assert '<meta http-equiv="refresh" content="3">' in page and "reloads itself" in page

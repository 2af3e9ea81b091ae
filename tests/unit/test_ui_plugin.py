"""The pure half of the UI plugin (detector/guard/ha_health.py): who sees what, what a run's fate reads as.

The plugin in a real Airflow API server is tests/integration/test_ui_plugin.py; in a browser,
tests/integration/test_ui_plugin_browser.py.
"""

from __future__ import annotations

from typing import Any

from detector.core.decisions import REMEDIATION_NOTE_PREFIX
from detector.core.model import GUARD_NOTE_PREFIX
from detector.guard import ha_health

LINKS = ha_health.Links("/airflow/")


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


def test_the_fate_of_a_duplicate_comes_from_its_note_and_its_tasks() -> None:
    fresh = _run("r", kept=False)
    ran = _run("r", kept=False, started=1)
    assert "guard" in ha_health.what_dupguard_did(fresh, GUARD_NOTE_PREFIX + "r1 (...)")
    assert "before its tasks started" in ha_health.what_dupguard_did(fresh, REMEDIATION_NOTE_PREFIX + "r1 (x)")
    assert "too late" in ha_health.what_dupguard_did(ran, REMEDIATION_NOTE_PREFIX + "r1 (x)")
    assert ha_health.what_dupguard_did(fresh, "a note someone typed").startswith("not stopped yet")
    assert ha_health.what_dupguard_did(ran, None).startswith("not stopped: its tasks ran")


def test_the_run_tab_of_a_duplicate_links_the_kept_run_and_escapes_everything() -> None:
    doc = ha_health.readable(_doc(), None)
    page = ha_health.render_run(doc, "<secret>", "r2", {}, LINKS, "tab")
    assert "is a duplicate of" in page and "%3Csecret%3E" in page and "<secret>" not in page
    page = ha_health.render_run(doc, "orders", "r1", {}, LINKS, "tab")
    assert "kept run of a duplicate group: 1 duplicate" in page
    assert 'href="/airflow/dags/orders/runs/r2/plugin/tab" target="_top"' in page
    assert "found no duplicate" in ha_health.render_run(doc, "orders", "r9", {}, LINKS, "tab")


def test_the_nav_page_filters_by_dag_and_kind() -> None:
    doc = ha_health.readable(_doc(), {"orders"})
    every = ha_health.render_nav(doc, None, LINKS, "tab")
    assert "duplicate_group" in every and "mine" in every
    only_checks = ha_health.render_nav(doc, None, LINKS, "tab", kind="trigger_flapping")
    assert "r1" not in only_checks.split("</form>")[1] and "mine" in only_checks
    assert "No open finding" in ha_health.render_nav(doc, None, LINKS, "tab", dag="elsewhere")


def test_a_failed_scan_is_said_on_the_page() -> None:
    page = ha_health.render_nav({"error": {"message": "database unreachable"}}, None, LINKS, "tab")
    assert "could not scan: database unreachable" in page and "No open finding" not in page

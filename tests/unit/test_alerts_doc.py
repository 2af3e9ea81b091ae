"""docs/reference/alerts.md lists every alert on-call can receive, and is what the code generates."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from detector.actions.alerts.notice import alertname_of
from detector.app.alerts_doc import RULES, check_alerts
from detector.checks.registry import KINDS

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "docs" / "runbooks.md"


def test_every_alert_has_its_runbook_section() -> None:
    """Each alert the code sends and each rule of the chart has its ``## <alertname>`` in docs/runbooks.md."""
    sections = set(re.findall(r"^## (Dupguard\w+)$", RUNBOOKS.read_text(), re.M))
    sent = {a.alertname for a in check_alerts()} | {"DupguardDuplicateRun"}
    rules = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert sent - sections == set() and rules - sections == set()


def test_every_registered_check_raises_its_own_alert() -> None:
    """The ast reading finds an Observation of every registered kind, named after it, and the alternate
    name the stranded check picks for copies of a consumed event."""
    found = list(check_alerts())
    assert {alertname_of(k) for k in KINDS} <= {a.alertname for a in found}
    copies = [a for a in found if a.alertname == "DupguardTriggerCopies" and a.kind == "stranded_events"]
    assert copies and "lost" in copies[0].when
    repair = next(a for a in found if a.kind == "stranded_repair")
    assert "critical for `failed`" in repair.severity

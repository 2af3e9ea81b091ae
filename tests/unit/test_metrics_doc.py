"""docs/reference/metrics.md lists every metric dupguard exports, and is what the code generates."""

from __future__ import annotations

import re

from detector.app.alerts_doc import RULES
from detector.app.metrics_doc import metrics


def test_the_page_has_the_checks_own_metrics_and_labels() -> None:
    """A check's metrics.py (through the registry) is listed with its module; labels without a sample yet
    (``dupguard_remediations_total`` before any remediation) still show."""
    by = {m.name: m for m in metrics()}
    assert by["dupguard_stranded_repairs_total"].source == "detector/checks/stranded_events/metrics.py"
    assert by["dupguard_remediations_total"].labels == ("mode", "backend", "result")
    assert "failed" in by["dupguard_remediations_total"].values["result"]
    assert "lock_pooled" in by["dupguard_state"].values["state"]
    assert by["dupguard_poll_duration_seconds"].type == "histogram"


def test_every_metric_the_alert_rules_use_is_listed() -> None:
    """A rule on a renamed metric would never fire: each dupguard_ name in the rule file is on the page."""
    names = {m.name for m in metrics()}
    used = set(re.findall(r"\b(dupguard_[a-z_]+)", RULES.read_text()))
    assert used and used <= names, used - names

"""The always-on log sink: ``remediation_outcome`` carries what really happened to each duplicate."""

from __future__ import annotations

from dataclasses import replace

from structlog.testing import capture_logs

from detector.actions.alerts.channels.log import log_event
from detector.core.ports import AlertKind, Result, StartedTask
from tests.unit.test_alert_format import _event, _finding, _outcome


def test_caught_after_start_is_logged_apart_as_a_warning_naming_the_task() -> None:
    """A duplicate stopped after its task had started: ``remediation_outcome`` at warning level, status
    ``caught_after_start``, and the result names the task with its states; a clean stop stays info."""
    e = _event(_finding(n_dups=2))
    done, caught = _outcome(e, Result.DONE).results[0], _outcome(e, Result.CAUGHT_AFTER_START).results[1]
    caught = replace(caught, started_tasks=(StartedTask("extract", -1, None, "failed"),))
    with capture_logs() as logs:
        log_event(replace(e, kind=AlertKind.OUTCOME, results=(done, caught)))
        log_event(replace(e, kind=AlertKind.OUTCOME, results=(done,)))
    first, second = (entry for entry in logs if entry["event"] == "remediation_outcome")
    assert first["log_level"] == "warning" and first["status"] == "caught_after_start"
    assert [r["result"] for r in first["results"]] == ["done", "caught_after_start"]
    assert first["results"][1]["started_tasks"] == [
        {"task_id": "extract", "map_index": -1, "state_before": None, "state_after": "failed"}
    ]
    assert second["log_level"] == "info" and second["status"] == "remediated"

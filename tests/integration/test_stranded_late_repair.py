"""Events committed late (docs/explanation/airflow-internals.md, "Committed late") through the runner, as `dupguard run`
does each check pass, on Airflow's stranded_late_commit dump: alerted once with its reason, and never repaired. A
queue row at the event's timestamp would make a run whose window is (the earlier run's run_after, that
timestamp]: the events the window run consumed in that range would be consumed a second time."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from detector.app.ledger import MemoryLedger
from tests.integration.test_stranded_repair import _db, _outcomes, _queue, _runner
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration
SCENARIO = "stranded_late_commit"


@pytest.mark.parametrize("version", ["3.1.2", "3.3.2"])
@pytest.mark.parametrize("mode", ["requeue", "dry-run"])
def test_a_late_set_is_alerted_once_and_never_requeued(version: str, mode: str, pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(version, SCENARIO))
    [truth] = ground_truth(version, SCENARIO)["expected_committed_late"]
    runner, recorder, metrics = _runner(db, mode, MemoryLedger())
    with capture_logs() as logs:
        runner.run("stranded_events", datetime.now(UTC))
        runner.run("stranded_events", datetime.now(UTC))
    [alert] = [n for n in recorder.notices if n.kind == "stranded_events"]
    assert alert.observation.facts["reason"] == "committed_late"
    assert alert.observation.facts["event_ids"] == truth["event_ids"]
    assert alert.observation.facts["run_id"] == truth["window_run_id"]
    assert _queue(db.engine) == [] and _outcomes(recorder) == []
    assert not [e for e in logs if str(e["event"]).startswith("stranded_repair")]
    for outcome in ("planned", "requeued", "refused"):
        assert not metrics.registry.get_sample_value("dupguard_stranded_repairs_total", {"outcome": outcome})

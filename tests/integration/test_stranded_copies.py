"""A trigger's second copy of a message a run consumed (Airflow-made fixture trigger_event_one_run,
docs/explanation/airflow-internals.md, "One message, one asset event per triggerer"): two triggerers ran one
AssetWatcher trigger, the run consumed the first copy only, and the second is consumed by no run. It is still
reported (it is evidence of the double-run trigger) but as a copy, never as "the consumer will not run for it", and
the repair refuses it: re-queueing it would run the consumer again for a message already processed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from structlog.testing import capture_logs

from detector.app.ledger import MemoryLedger
from detector.checks.runner import CheckRunner
from detector.checks.stranded_events.check import StrandedEventsCheck
from detector.checks.stranded_events.rule import StrandedSet
from detector.config import Config
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.integration.test_split_partitions import SplitRecorder
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration
VERSION, SCENARIO = "3.1.2", "trigger_event_one_run"


def test_the_unconsumed_copy_is_reported_as_a_copy_and_never_requeued(pg_templates: Templates) -> None:
    truth = ground_truth(VERSION, SCENARIO)
    [stranded] = truth["expected_stranded"]
    [run] = truth["runs"]
    db = open_airflow_db(make_engine(parse_url(pg_templates.clone(VERSION, SCENARIO))))
    metrics, recorder = Metrics(), SplitRecorder()
    config = Config.of(database_url="postgresql://unused", repair_stranded="requeue")
    runner = CheckRunner(db, [StrandedEventsCheck(config, metrics)], MemoryLedger(), recorder, metrics, cluster="c")
    with capture_logs() as logs:
        runner.run("stranded_events", datetime.now(UTC))
    with db.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM asset_dag_run_queue")).scalar_one() == 0
    [found] = [n.observation for n in recorder.notices if n.kind == "stranded_events"]
    assert isinstance(found.subject, StrandedSet) and list(found.subject.event_ids) == stranded["event_ids"]
    [copy_id] = stranded["event_ids"]
    [line] = [x for x in found.lines if x.startswith(f"event {copy_id} ")]
    assert f"a copy (same message id) of event {run['event_ids'][0]}, which run {run['run_id']} consumed" in line
    assert "consumed by no run" not in line and "will not" not in found.advice
    assert found.facts["copies"] == [
        {"id": copy_id, "of_event": run["event_ids"][0], "run_id": run["run_id"], "proven": True}
    ]
    [refused] = [n for n in recorder.notices if n.kind == "stranded_repair"]
    assert refused.observation.facts["outcome"] == "refused"
    assert f"event {copy_id} is a copy (same message id) of event {run['event_ids'][0]}" in refused.text
    assert not [e for e in logs if e["event"] == "stranded_repair_requeued"]

"""The stranded-events repair through the runner (what `dupguard run` does each check pass), on the dumps
Airflow made (scripts/airflow/scenarios_stranded.py): dry-run writes nothing and logs the plan; requeue
writes exactly the row; never twice per set (memory and durable ledger); nothing without the fence; a
queue row that appeared meanwhile wins; the follow-up reports the run Airflow's scheduler made."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.app.cli import main
from detector.app.ledger import DbLedger, MemoryLedger, init_db
from detector.checks.runner import CheckRunner
from detector.checks.stranded_events import statements
from detector.checks.stranded_events.check import StrandedEventsCheck
from detector.checks.stranded_events.requeue import RequeueWriter
from detector.checks.stranded_events.rule import StrandedSet, find_stranded
from detector.config import Config
from detector.core.fence import UNFENCED, Fence, FenceSource
from detector.core.ports import Ledger
from detector.metadb.engine import AirflowDb, connect, make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.integration.test_split_partitions import SplitRecorder
from tests.integration.test_stranded_repair_airflow import airflow_loop
from tests.pg import Templates, execute_admin, ground_truth

pytestmark = pytest.mark.integration
VERSION, SCENARIO = "3.1.2", "stranded_race"
COLUMNS = "SELECT column_name FROM information_schema.columns WHERE table_name = 'dag_run' ORDER BY ordinal_position"
WAITING_INSERT = text(
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
    "AND query LIKE 'INSERT INTO asset_dag_run_queue%'"
)


@pytest.fixture
def role() -> Iterator[str]:
    name = f"dg_rep_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{name}" LOGIN')
    yield name
    execute_admin(f'DROP ROLE IF EXISTS "{name}"')


def utcnow() -> datetime:
    return datetime.now(UTC)


def _db(url: str) -> AirflowDb:
    return open_airflow_db(make_engine(parse_url(url)))


def _runner(db: AirflowDb, mode: str, ledger: Ledger, *, fence: FenceSource = lambda: UNFENCED,
            deadline: timedelta = timedelta(minutes=15)) -> tuple[CheckRunner, SplitRecorder, Metrics]:  # fmt: skip
    metrics, recorder = Metrics(), SplitRecorder()
    config = Config.of(database_url="postgresql://unused", repair_stranded=mode, stranded_repair_deadline=deadline)
    check = StrandedEventsCheck(config, metrics)
    return CheckRunner(db, [check], ledger, recorder, metrics, cluster="prod-eu", fence=fence), recorder, metrics


def _queue(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r) for r in conn.execute(text("SELECT asset_id, target_dag_id, created_at FROM asset_dag_run_queue"))
        ]


def _outcomes(recorder: SplitRecorder) -> list[str]:
    return [n.observation.facts["outcome"] for n in recorder.notices if n.kind == "stranded_repair"]


def _stranded(db: AirflowDb) -> StrandedSet:
    with connect(db.engine) as conn:
        [s] = find_stranded(statements.stranded_event_candidates(conn, db.tables, None))
    return s


def test_dry_run_writes_nothing_and_logs_the_row_it_would_write_once(pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    [truth] = ground_truth(VERSION, SCENARIO)["expected_stranded"]
    runner, recorder, metrics = _runner(db, "dry-run", MemoryLedger())
    with capture_logs() as logs:
        runner.run("stranded_events", utcnow())
        runner.run("stranded_events", utcnow())
    assert _queue(db.engine) == []
    [planned] = [e for e in logs if e["event"] == "stranded_repair_planned"]
    assert planned["event_ids"] == truth["event_ids"] and planned["dag_id"] == truth["dag_id"]
    assert "would write: INSERT INTO asset_dag_run_queue" in planned["detail"]
    assert _outcomes(recorder) == ["planned"]
    assert metrics.registry.get_sample_value("dupguard_stranded_repairs_total", {"outcome": "planned"}) == 1


def test_off_does_not_even_plan(pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    runner, recorder, _ = _runner(db, "off", MemoryLedger())
    with capture_logs() as logs:
        runner.run("stranded_events", utcnow())
    assert _queue(db.engine) == [] and _outcomes(recorder) == []
    assert not [e for e in logs if str(e["event"]).startswith("stranded_repair")]


def test_requeue_writes_exactly_the_row_and_the_follow_up_reports_airflows_run(
    pg_templates: Templates, tmp_path: Path
) -> None:
    url = pg_templates.clone(VERSION, SCENARIO)
    db = _db(url)
    [truth] = ground_truth(VERSION, SCENARIO)["expected_stranded"]
    s = _stranded(db)
    runner, recorder, metrics = _runner(db, "requeue", MemoryLedger())
    runner.run("stranded_events", utcnow())
    asset_id = _asset_id(db.engine, truth["event_ids"][0])
    assert _queue(db.engine) == [(asset_id, truth["dag_id"], s.events[-1].timestamp)]
    assert _outcomes(recorder) == ["requeued"]
    runner.run("stranded_events", utcnow())  # no run yet: still waiting, nothing new
    assert _outcomes(recorder) == ["requeued"]
    made = airflow_loop(VERSION, url, truth["dag_id"], tmp_path)["runs"][-1]  # Airflow's scheduler
    runner.run("stranded_events", utcnow())
    assert _outcomes(recorder) == ["requeued", "repaired"]
    repaired = recorder.notices[-1]
    assert repaired.observation.facts["run_id"] == made["run_id"] and made["event_ids"] == truth["event_ids"]
    assert repaired.alertname == "DupguardStrandedRepair" and made["run_id"] in repaired.text
    assert metrics.registry.get_sample_value("dupguard_stranded_repairs_total", {"outcome": "repaired"}) == 1


def test_a_run_that_does_not_appear_by_the_deadline_is_reported_unverified(pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    runner, recorder, _ = _runner(db, "requeue", MemoryLedger(), deadline=timedelta(microseconds=1))
    runner.run("stranded_events", utcnow())
    time.sleep(0.01)  # past the 1 µs deadline on the database clock (not a timed assertion)
    with capture_logs() as logs:
        runner.run("stranded_events", utcnow())
    assert _outcomes(recorder) == ["requeued", "repair_unverified"]
    [line] = [e for e in logs if e["event"] == "stranded_repair_repair_unverified"]
    assert line["log_level"] == "error" and recorder.notices[-1].observation.severity == "error"


def _asset_id(engine: Engine, event_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT asset_id FROM asset_event WHERE id = :i"), {"i": event_id}).scalar_one())


@pytest.mark.parametrize("durable", [False, True])
def test_a_set_is_repaired_once_even_if_it_looks_stranded_again(pg_templates: Templates, durable: bool) -> None:
    """The row is deleted after the write (as if it never landed): the claim keeps a second write out,
    in the same process and, with the durable ledger, after a restart (a new runner, a new check)."""
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    if durable:
        init_db(db.engine)
    ledger: Ledger = DbLedger(db.engine) if durable else MemoryLedger()
    runner, recorder, _ = _runner(db, "requeue", ledger)
    runner.run("stranded_events", utcnow())
    assert len(_queue(db.engine)) == 1
    with db.engine.begin() as conn:
        conn.execute(text("DELETE FROM asset_dag_run_queue"))
    restarted, again, _ = _runner(db, "requeue", DbLedger(db.engine) if durable else ledger)
    for r in (runner, restarted):
        assert r.run("stranded_events", utcnow())  # still found stranded: alerted already, not repaired
    assert _queue(db.engine) == [] and _outcomes(recorder) == ["requeued"] and _outcomes(again) == []


def test_without_the_fence_nothing_is_written_nor_claimed(pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    ledger = MemoryLedger()
    fence: list[Fence | None] = [None]
    runner, recorder, _ = _runner(db, "requeue", ledger, fence=lambda: fence[0])
    runner.run("stranded_events", utcnow())  # standing by / waiting after a takeover
    assert _queue(db.engine) == [] and _outcomes(recorder) == []
    fence[0] = UNFENCED  # leading now: the same set is repaired (no claim was taken before)
    runner.run("stranded_events", utcnow())
    assert len(_queue(db.engine)) == 1 and _outcomes(recorder) == ["requeued"]


def test_a_fence_lost_during_the_write_rolls_it_back_and_says_so(pg_templates: Templates) -> None:
    """The lock is not granted to the fence's backend (another replica leads): rolled back at COMMIT."""
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    lost = Fence(term=3, ends=math.inf, clock=lambda: 0.0, key=7_349_001, backend_pid=1)
    runner, recorder, _ = _runner(db, "requeue", MemoryLedger(), fence=lambda: lost)
    runner.run("stranded_events", utcnow())
    assert _queue(db.engine) == [] and _outcomes(recorder) == ["failed"]
    assert "no longer granted" in recorder.notices[-1].text


def test_a_queue_row_committed_before_the_write_wins(pg_templates: Templates) -> None:
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    s = _stranded(db)
    asset_id = _asset_id(db.engine, s.event_ids[0])
    with db.engine.begin() as conn:  # a new event queued the DAG after the check's read
        conn.execute(text("INSERT INTO asset_dag_run_queue VALUES (:a, :d, now())"), {"a": asset_id, "d": s.dag_id})
    before = _queue(db.engine)
    written = RequeueWriter(db.engine, db.tables).write(s)
    assert written.outcome == "skipped" and "queue row now" in written.detail and _queue(db.engine) == before


def _write_against(db: AirflowDb, s: StrandedSet, before_commit: str, params: dict[str, Any]) -> Any:
    """dupguard's write while another transaction holds (asset, DAG) in the queue: that transaction runs
    ``before_commit`` once dupguard's INSERT waits on its row, then commits; the write's result."""
    asset_id = _asset_id(db.engine, s.event_ids[0])
    with db.engine.connect() as other:
        tx = other.begin()
        other.execute(text("INSERT INTO asset_dag_run_queue VALUES (:a, :d, now())"), {"a": asset_id, "d": s.dag_id})
        result: list[Any] = []
        writer = threading.Thread(target=lambda: result.append(RequeueWriter(db.engine, db.tables).write(s)))
        writer.start()
        with db.engine.connect() as probe:  # dupguard's INSERT is waiting on the other transaction's row
            for _ in range(500):
                waiting = probe.execute(WAITING_INSERT).scalar_one()
                probe.rollback()
                if waiting:
                    break
                time.sleep(0.02)
        assert waiting == 1
        other.execute(text(before_commit), params | {"a": asset_id, "d": s.dag_id})
        tx.commit()
    writer.join(30)
    return result[0]


def test_a_queue_row_inserted_while_dupguard_writes_wins_and_nothing_is_written(pg_templates: Templates) -> None:
    """The other transaction inserts (asset, DAG) after dupguard's re-read: dupguard's INSERT waits for it
    (ON CONFLICT DO NOTHING), then writes nothing and says so."""
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    s = _stranded(db)
    written = _write_against(db, s, "SELECT 1", {})
    assert written.outcome == "skipped" and "appeared meanwhile" in written.detail
    [(_, _, created)] = _queue(db.engine)
    assert created != s.events[-1].timestamp  # the other transaction's row, not dupguard's


def test_a_run_committed_while_dupguard_writes_rolls_the_row_back(pg_templates: Templates) -> None:
    """As the scheduler would: the other transaction took a new event's row, made a run that consumed the
    stranded events and deleted the row, and committed while dupguard's INSERT waited. The INSERT then
    lands, and the re-read after it sees the run: rolled back (the row would make a second run consume
    them), nothing written."""
    db = _db(pg_templates.clone(VERSION, SCENARIO))
    s = _stranded(db)
    with db.engine.connect() as conn:
        columns = [c for c in conn.execute(text(COLUMNS)).scalars() if c not in ("id", "run_id", "run_after")]
    cols = ", ".join(columns)
    scheduler = f"""
        WITH run AS (
            INSERT INTO dag_run ({cols}, run_id, run_after)
            SELECT {cols}, run_id || '_later', run_after + interval '1 hour' FROM dag_run WHERE run_id = :r
            RETURNING id
        ), consumed AS (
            INSERT INTO dagrun_asset_event (dag_run_id, event_id) SELECT run.id, e FROM run, unnest(:events) AS e
        )
        DELETE FROM asset_dag_run_queue WHERE asset_id = :a AND target_dag_id = :d
    """
    written = _write_against(db, s, scheduler, {"r": s.run_id, "events": list(s.event_ids)})
    assert written.outcome == "skipped" and "took these events meanwhile" in written.detail
    assert _queue(db.engine) == []


def test_scan_never_repairs_and_run_once_does(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = pg_templates.clone(VERSION, SCENARIO)
    monkeypatch.setenv("DUPGUARD_REPAIR_STRANDED", "requeue")
    assert main(["scan", "--database-url", url, "--format", "json"]) == 1
    capsys.readouterr()
    assert _queue(_db(url).engine) == []
    assert main(["run", "--once", "--database-url", url, "--http-port", "0"]) == 0
    assert len(_queue(_db(url).engine)) == 1


def test_requeue_without_the_insert_grant_says_so_once_and_repairs_once_granted(
    pg_templates: Templates, role: str
) -> None:
    """SELECT on everything (the deploy guide's read-only grant and more), no INSERT on asset_dag_run_queue:
    ``stranded_repair_not_permitted`` once, no claim, nothing written, no crash; once granted, repaired."""
    url = pg_templates.clone(VERSION, SCENARIO)
    dbname = str(make_url(url).database)
    execute_admin(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"', dbname=dbname)
    as_role = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        db = _db(as_role)
        runner, recorder, metrics = _runner(db, "requeue", MemoryLedger())
        with capture_logs() as logs:
            assert runner.run_reported("stranded_events", utcnow()) is True
            assert runner.run_reported("stranded_events", utcnow()) is True
        said = [e for e in logs if e["event"] == "stranded_repair_not_permitted"]
        assert len(said) == 1 and "GRANT INSERT ON asset_dag_run_queue" in said[0]["detail"]
        assert _queue(db.engine) == [] and _outcomes(recorder) == []
        assert metrics.registry.get_sample_value("dupguard_stranded_repairs_total", {"outcome": "not_permitted"}) == 1
        execute_admin(f'GRANT INSERT ON asset_dag_run_queue TO "{role}"', dbname=dbname)
        runner.run("stranded_events", utcnow())
        assert len(_queue(db.engine)) == 1 and _outcomes(recorder) == ["requeued"]
        db.engine.dispose()
    finally:
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)

"""Backend ``db`` on real Airflow schemas with duplicates made by Airflow's own scheduler code.

No API server is needed: the writes are checked in the database against what Airflow's
``set_dag_run_state_to_failed`` does (docs/explanation/airflow-internals.md, "What marking a run failed does"),
including the row lock that keeps a task which starts concurrently from being touched.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg2
import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, Outcome, plan
from detector.core.ports import Result, StartedTask
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration


class Db:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = make_engine(parse_url(url))
        self.db = open_airflow_db(self.engine)

    def actions(self, mode: Mode, *, remediate_started: bool = False) -> list[Action]:
        now = datetime.now(UTC)
        return plan(scan(self.db, now=now).findings, mode, now=now, remediate_started=remediate_started)

    def remediator(self, mode: Mode, **overrides: Any) -> GuardedRemediator:
        settings = {"database_url": self.url, "remediation": mode.value, "remediation_backend": "db"} | overrides
        remediator = build_remediator(Config.of(**settings), self.engine, self.db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        return remediator


def _unchanged_except(before: dict[str, Any], after: dict[str, Any], targets: set[str]) -> None:
    assert before.keys() == after.keys()
    for run_id, row in before.items():
        if run_id not in targets:
            assert after[run_id] == row, f"{run_id} changed but was not a target"


def test_fail_mirrors_set_dag_run_state_to_failed(fanout: Db) -> None:
    """Run failed with end_date; unstarted TIs skipped with start/end/duration like TI.set_state; the
    note upserted with no user; kept runs and everything else untouched."""
    actions = fanout.actions(Mode.FAIL)
    assert len(actions) == 3
    before = db_state(fanout.url)
    results = [fanout.remediator(Mode.FAIL).execute(a) for a in actions]
    after = db_state(fanout.url)
    assert [r.result for r in results] == [Result.DONE] * 3
    for action in actions:
        row = after[action.run.run_id]
        assert row.state == "failed" and row.end_date is not None and row.updated_at > before[row.run_id].updated_at
        for state, start, end, duration in row.tasks.values():
            assert state == "skipped" and start is not None and end == start and duration == 0
        assert row.note == action.note and row.note_user is None
        assert after[action.kept_run_id] == before[action.kept_run_id]
    _unchanged_except(before, after, {a.run.run_id for a in actions})
    truth = ground_truth("3.1.2", "race_asset_fanout")
    assert sorted(a.kept_run_id for a in actions) == sorted(g["first_run_id"] for g in truth["expected_groups"])


def test_fail_with_remediate_started_fails_running_tasks_and_skips_the_rest(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='running', start_date=now() - interval '3 seconds' "
        "WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    assert fanout.remediator(Mode.FAIL).execute(action).result is Result.TOO_LATE
    result = fanout.remediator(Mode.FAIL, remediate_started=True).execute(action)
    row = db_state(fanout.url)[action.run.run_id]
    assert row.state == "failed"
    assert row.tasks["extract"][0] == "failed" and row.tasks["extract"][3] >= 3
    assert row.tasks["load"][0] == "skipped"
    # Read back inside the transaction: the running task was stopped mid-run, and the result says so.
    assert result.result is Result.CAUGHT_AFTER_START, result.detail
    assert result.started_tasks == (StartedTask("extract", -1, "running", "failed"),)
    assert result.committed_at is not None


def test_skip_skips_every_unfinished_task_and_leaves_the_run(fanout: Db) -> None:
    actions = fanout.actions(Mode.SKIP)
    before = db_state(fanout.url)
    results = [fanout.remediator(Mode.SKIP).execute(a) for a in actions]
    after = db_state(fanout.url)
    assert [r.result for r in results] == [Result.DONE] * 3
    for action in actions:
        row = after[action.run.run_id]
        assert row.state == "queued" and {t[0] for t in row.tasks.values()} == {"skipped"}
        assert row.note == action.note
    _unchanged_except(before, after, {a.run.run_id for a in actions})


@pytest.mark.parametrize("mode", [Mode.FAIL, Mode.SKIP])
def test_second_execute_is_already(fanout: Db, mode: Mode) -> None:
    action = fanout.actions(mode)[0]
    remediator = fanout.remediator(mode)
    assert remediator.execute(action).result is Result.DONE
    once = db_state(fanout.url)
    assert remediator.execute(action).result is Result.ALREADY
    assert db_state(fanout.url) == once


def test_dry_run_writes_nothing(fanout: Db) -> None:
    actions = fanout.actions(Mode.DRY_RUN)
    before = db_state(fanout.url)
    results = [fanout.remediator(Mode.DRY_RUN, remediation_backend="db").execute(a) for a in actions]
    assert [r.result for r in results] == [Result.DRY_RUN] * 3
    assert db_state(fanout.url) == before


def test_task_started_after_planning_is_too_late_and_untouched(fanout: Db) -> None:
    action = fanout.actions(Mode.SKIP)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='running' WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    before = db_state(fanout.url)
    result = fanout.remediator(Mode.SKIP).execute(action)
    assert result.result is Result.TOO_LATE and "extract=running" in result.detail
    assert db_state(fanout.url) == before


def test_a_task_starting_while_we_wait_for_its_lock_is_seen_and_not_touched(fanout: Db) -> None:
    """Like the Execution API's ti_run, another transaction locks the TI and sets it running; the
    remediation passes the unlocked guard, blocks on the TI lock, then sees RUNNING and stops."""
    action = fanout.actions(Mode.FAIL)[0]
    other = psycopg2.connect(make_url(fanout.url).render_as_string(hide_password=False))
    try:
        with other.cursor() as cur:
            cur.execute(
                "SELECT id FROM task_instance WHERE run_id=%s AND task_id='extract' FOR UPDATE", (action.run.run_id,)
            )
            cur.execute(
                "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=%s AND task_id='extract'",
                (action.run.run_id,),
            )
        results: list[Any] = []
        worker = threading.Thread(target=lambda: results.append(fanout.remediator(Mode.FAIL).execute(action)))
        worker.start()
        time.sleep(0.5)
        assert worker.is_alive(), "the remediation should be waiting for the task instance's row lock"
        other.commit()
        worker.join(timeout=10)
    finally:
        other.close()
    (result,) = results
    assert result.result is Result.TOO_LATE and "under lock" in result.detail
    row = db_state(fanout.url)[action.run.run_id]
    assert row.state == "queued" and row.tasks["extract"][0] == "running" and row.tasks["load"][0] is None
    assert row.note is None


def test_deleted_run_is_gone(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, "DELETE FROM dag_run WHERE run_id=:r", r=action.run.run_id)
    assert fanout.remediator(Mode.FAIL).execute(action).result is Result.GONE


def test_kept_run_is_refused_even_if_asked(fanout: Db) -> None:
    """Defence in depth: an action naming the kept run as its target is refused, nothing written."""
    action = fanout.actions(Mode.FAIL)[0]
    kept = next(r for r in fanout.actions(Mode.FAIL) if r.finding_key == action.finding_key)
    evil = Action(kept.finding_key, kept.dag_id, kept.run, kept.run.run_id, Outcome.REMEDIATE, Mode.FAIL, kept.note)
    before = db_state(fanout.url)
    result = fanout.remediator(Mode.FAIL).execute(evil)
    assert result.result is Result.FAILED and "kept run" in result.detail
    assert db_state(fanout.url) == before


def test_airflow_made_duplicate_whose_task_ran_is_too_late(pg_templates: Templates) -> None:
    db = Db(pg_templates.clone("3.1.2", "race_asset"))
    try:
        before = db_state(db.url)
        (action,) = db.actions(Mode.FAIL)
        assert db.remediator(Mode.FAIL).execute(action).result is Result.TOO_LATE
        assert db_state(db.url) == before
    finally:
        db.engine.dispose()


def test_partitioned_duplicate_on_3_2_is_failed(pg_templates: Templates) -> None:
    db = Db(pg_templates.clone("3.2.2", "race_partitioned"))
    try:
        (group,) = ground_truth("3.2.2", "race_partitioned")["expected_groups"]
        (action,) = db.actions(Mode.FAIL)
        assert action.kept_run_id == group["first_run_id"]
        before = db_state(db.url)
        assert db.remediator(Mode.FAIL).execute(action).result is Result.DONE
        after = db_state(db.url)
        assert after[action.run.run_id].state == "failed"
        assert {t[0] for t in after[action.run.run_id].tasks.values()} == {"skipped"}
        _unchanged_except(before, after, {action.run.run_id})
    finally:
        db.engine.dispose()


@pytest.mark.parametrize("version", ["3.0.6", "3.1.2"])
def test_overlap_race_fails_the_run_that_consumed_less_and_nothing_else(version: str, pg_templates: Templates) -> None:
    """Airflow-made overlap race (different run_after, one shared event): the run holding every event
    is kept; the other is failed; every other row is untouched."""
    db = Db(pg_templates.clone(version, "race_overlap"))
    try:
        (group,) = ground_truth(version, "race_overlap")["expected_groups"]
        (action,) = db.actions(Mode.FAIL)
        assert action.kept_run_id == group["first_run_id"]
        assert action.run.run_id == group["run_ids"][1]
        before = db_state(db.url)
        assert db.remediator(Mode.FAIL).execute(action).result is Result.DONE
        after = db_state(db.url)
        assert after[action.run.run_id].state == "failed"
        assert {t[0] for t in after[action.run.run_id].tasks.values()} == {"skipped"}
        _unchanged_except(before, after, {action.run.run_id})
    finally:
        db.engine.dispose()

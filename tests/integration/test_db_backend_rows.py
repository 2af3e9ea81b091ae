"""What the ``db`` backend leaves in Airflow's rows, column by column, and what its result says (the
survivors of ``detector/actions/remediation/db.py`` under mutation, benchmarks/results/mutation.md).

Real PostgreSQL with the real Airflow 3.1.2 schema (the ``race_asset_fanout`` fixture: three duplicate
pairs, every run queued, no task started). The backend's clock is fixed, so every timestamp it writes
is known: the columns are compared whole with what Airflow's ``TaskInstance.set_state`` /
``DagRun.set_state`` would hold (docs/explanation/airflow-internals.md, "What marking a run failed does"), and the
session settings the write ran under are read on its own server connection.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg2
import psycopg2.errors
import pytest
from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url

from detector.actions.remediation.db import DbBackend
from detector.actions.remediation.guarded import GuardedRemediator, Recheck, Verdict, judge, read_state
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.fence import Fence
from detector.core.plan import Action, Mode
from detector.core.ports import Result, StartedTask
from detector.metadb.engine import make_engine, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.integration.test_remediation_db import Db, _unchanged_except

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)  # the backend's clock: every timestamp it writes


def _remediator(db: Db, mode: Mode, *, remediate_started: bool = False, **options: Any) -> GuardedRemediator:
    config = Config.of(
        database_url=db.url, remediation=mode.value, remediation_backend="db", remediate_started=remediate_started
    )
    remediator = build_remediator(config, db.engine, db.db.tables, Metrics(), clock=lambda: NOW, **options)
    assert isinstance(remediator, GuardedRemediator)
    return remediator


def _backend_engine(remediator: GuardedRemediator) -> Engine:
    """The engine the db backend writes with: a pool of its own, apart from the engine it was given."""
    backend = remediator.backend
    assert isinstance(backend, DbBackend)
    return backend.engine


def _backend(db: Db, mode: Mode, **options: Any) -> DbBackend:
    backend = _remediator(db, mode, **options).backend
    assert isinstance(backend, DbBackend)
    return backend


def _rows(db: Db, query: str, **params: Any) -> list[tuple[Any, ...]]:
    with db.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(query), params)]


def _run_row(db: Db, run_id: str) -> tuple[Any, ...]:
    (row,) = _rows(db, "SELECT state, start_date, end_date, updated_at FROM dag_run WHERE run_id = :r", r=run_id)
    return row


def _tis(db: Db, run_id: str) -> dict[str, tuple[Any, ...]]:
    rows = _rows(
        db,
        "SELECT task_id, state, start_date, end_date, duration, updated_at FROM task_instance WHERE run_id = :r",
        r=run_id,
    )
    return {r[0]: r[1:] for r in rows}


def _note(db: Db, run_id: str) -> tuple[Any, ...] | None:
    rows = _rows(
        db,
        "SELECT n.content, n.user_id, n.created_at, n.updated_at FROM dag_run_note n "
        "JOIN dag_run dr ON dr.id = n.dag_run_id WHERE dr.run_id = :r",
        r=run_id,
    )
    return rows[0] if rows else None


def test_fail_writes_the_columns_airflows_set_failed_writes(fanout: Db) -> None:
    """A queued duplicate failed: the run failed with start_date = end_date = updated_at = the write's
    clock; each task skipped with start/end = that time, duration 0, updated_at; the note with no user
    and both its timestamps. Nothing else in the database changes."""
    action = fanout.actions(Mode.FAIL)[0]
    before = db_state(fanout.url)
    result = _remediator(fanout, Mode.FAIL).execute(action)
    assert (result.result, result.detail) == (Result.DONE, "run -> failed; skipped: extract, load")
    assert result.started_tasks == ()
    assert _run_row(fanout, action.run.run_id) == ("failed", NOW, NOW, NOW)
    assert _tis(fanout, action.run.run_id) == {
        "extract": ("skipped", NOW, NOW, 0.0, NOW),
        "load": ("skipped", NOW, NOW, 0.0, NOW),
    }
    assert _note(fanout, action.run.run_id) == (action.note, None, NOW, NOW)
    _unchanged_except(before, db_state(fanout.url), {action.run.run_id})


def test_skip_writes_the_task_columns_and_leaves_the_run_row(fanout: Db) -> None:
    action = fanout.actions(Mode.SKIP)[0]
    run_before = _run_row(fanout, action.run.run_id)
    result = _remediator(fanout, Mode.SKIP).execute(action)
    assert (result.result, result.detail) == (Result.DONE, "skipped: extract, load")
    assert _run_row(fanout, action.run.run_id) == run_before
    assert _tis(fanout, action.run.run_id) == {
        "extract": ("skipped", NOW, NOW, 0.0, NOW),
        "load": ("skipped", NOW, NOW, 0.0, NOW),
    }
    assert _note(fanout, action.run.run_id) == (action.note, None, NOW, NOW)


def test_started_tasks_keep_their_own_start_and_end_and_get_their_duration(fanout: Db) -> None:
    """With DUPGUARD_REMEDIATE_STARTED: a running task (started 3 s before) is failed with its own
    start_date, end_date = the write, duration 3 s; a task waiting for its retry (ran 10 s to 5 s before)
    is skipped with both its dates kept, duration 5 s (TaskInstance.set_state fills only empty dates);
    the run, which had started 20 s before, keeps its start_date."""
    action = fanout.actions(Mode.FAIL, remediate_started=True)[0]
    run_id = action.run.run_id
    at = {"run": NOW - timedelta(seconds=20), "ran": NOW - timedelta(seconds=3), "try": NOW - timedelta(seconds=10)}
    sql(fanout.url, "UPDATE dag_run SET state = 'running', start_date = :s WHERE run_id = :r", s=at["run"], r=run_id)
    sql(
        fanout.url,
        "UPDATE task_instance SET state = 'running', start_date = :s, pid = 4242 "
        "WHERE run_id = :r AND task_id = 'extract'",
        s=at["ran"],
        r=run_id,
    )
    sql(
        fanout.url,
        "UPDATE task_instance SET state = 'up_for_retry', start_date = :s, end_date = :e "
        "WHERE run_id = :r AND task_id = 'load'",
        s=at["try"],
        e=NOW - timedelta(seconds=5),
        r=run_id,
    )
    result = _remediator(fanout, Mode.FAIL, remediate_started=True).execute(action)
    assert result.result is Result.CAUGHT_AFTER_START
    assert result.detail == (
        "caught after start: run -> failed; skipped: load; failed: extract, but task(s) had started before "
        "the write landed: extract (running -> failed), load (up_for_retry -> skipped)"
    )
    assert result.started_tasks == (
        StartedTask("extract", -1, "running", "failed"),
        StartedTask("load", -1, "up_for_retry", "skipped"),
    )
    assert _run_row(fanout, run_id) == ("failed", at["run"], NOW, NOW)
    assert _tis(fanout, run_id) == {
        "extract": ("failed", at["ran"], NOW, 3.0, NOW),
        "load": ("skipped", at["try"], NOW - timedelta(seconds=5), 5.0, NOW),
    }


@pytest.mark.parametrize("state", ["deferred", "up_for_reschedule"])
def test_fail_mode_fails_every_running_like_state(fanout: Db, state: str) -> None:
    """set_dag_run_state_to_failed marks RUNNING, DEFERRED and UP_FOR_RESCHEDULE tasks FAILED."""
    action = fanout.actions(Mode.FAIL, remediate_started=True)[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state = :s, start_date = :t WHERE run_id = :r AND task_id = 'extract'",
        s=state,
        t=NOW - timedelta(seconds=1),
        r=action.run.run_id,
    )
    result = _remediator(fanout, Mode.FAIL, remediate_started=True).execute(action)
    assert result.result is Result.CAUGHT_AFTER_START
    assert result.started_tasks == (StartedTask("extract", -1, state, "failed"),)
    assert _tis(fanout, action.run.run_id)["extract"] == ("failed", NOW - timedelta(seconds=1), NOW, 1.0, NOW)


def test_a_users_note_is_replaced_by_dupguards_and_keeps_its_creation_time(fanout: Db) -> None:
    """The note is upserted: an operator's note on the duplicate becomes dupguard's, with no user,
    updated now, created when the operator wrote it."""
    action = fanout.actions(Mode.FAIL)[0]
    written = NOW - timedelta(hours=1)
    sql(
        fanout.url,
        "INSERT INTO dag_run_note (dag_run_id, user_id, content, created_at, updated_at) "
        "SELECT id, 'admin', 'looked at it', :t, :t FROM dag_run WHERE run_id = :r",
        t=written,
        r=action.run.run_id,
    )
    assert _remediator(fanout, Mode.FAIL).execute(action).result is Result.DONE
    assert _note(fanout, action.run.run_id) == (action.note, None, written, NOW)


# --- the session the write runs in --------------------------------------------------------------


@pytest.fixture
def single(fanout: Db) -> Iterator[Db]:
    """``fanout`` on an engine of one pooled connection: the server session the write used is the one
    checked out after it."""
    engine = fanout.engine
    fanout.engine = make_engine(parse_url(fanout.url), pool_size=1)
    yield fanout
    fanout.engine.dispose()
    fanout.engine = engine


def _settings_during_writes(engine: Engine) -> list[tuple[str, str, int]]:
    """(lock_timeout, statement_timeout, backend pid) of the session, read right before each UPDATE."""
    seen: list[tuple[str, str, int]] = []

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith(("UPDATE", "INSERT")):
            with cursor.connection.cursor() as probe:
                probe.execute(
                    "SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), pg_backend_pid()"
                )
                seen.append(probe.fetchone())

    event.listen(engine, "before_cursor_execute", before)
    return seen


def _session_settings(engine: Engine) -> tuple[str, str, int]:
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT current_setting('lock_timeout'), current_setting('statement_timeout'), pg_backend_pid()")
        ).one()
        return row[0], row[1], row[2]


@pytest.mark.parametrize(
    ("options", "expected"),
    [({}, ("2s", "5s")), ({"lock_timeout_ms": 1250, "statement_timeout_ms": 3750}, ("1250ms", "3750ms"))],
)
def test_the_write_runs_under_its_timeouts_and_leaves_the_session_as_it_was(
    single: Db, options: dict[str, Any], expected: tuple[str, str]
) -> None:
    """Every UPDATE runs with lock_timeout / statement_timeout set (2 s / 5 s unless configured), and they
    end with the transaction (SET LOCAL): behind PgBouncer's transaction pooling a session setting would
    stay on a server connection Airflow's own processes use next."""
    action = single.actions(Mode.FAIL)[0]
    remediator = _remediator(single, Mode.FAIL, **options)
    engine = _backend_engine(remediator)  # the remediation's own pool (never the poll's)
    outside = _session_settings(engine)
    seen = _settings_during_writes(engine)
    assert remediator.execute(action).result is Result.DONE
    pid = outside[2]
    assert seen == [(*expected, pid)] * 3  # the tasks' UPDATE, the run's, the note's upsert
    assert _session_settings(engine) == outside


# --- what apply says when the locked re-read differs from the preview ---------------------------


def _apply(db: Db, action: Action, change: str) -> tuple[Result, str]:
    """``apply`` with the preview judged before ``change`` (SQL on the duplicate's or kept run's rows)
    was committed: the backend judges again on the locked rows."""
    preview = judge(action, read_state(db.engine, db.db.tables, action), remediate_started=False)
    assert preview.work is not None
    sql(db.url, change, r=action.run.run_id, k=action.kept_run_id)
    before = db_state(db.url)
    recheck: Recheck = lambda: Verdict(None)  # noqa: E731 - unused by the db backend: it judges under its locks
    applied = _backend(db, action.mode).apply(action, preview.work, recheck)
    assert db_state(db.url) == before, "nothing written"
    assert applied.committed_at is None and applied.started_tasks == ()
    return applied.result, applied.detail


def test_a_task_started_since_the_preview_is_too_late_under_lock(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    change = "UPDATE task_instance SET state = 'running', pid = 7 WHERE run_id = :r AND task_id = 'extract'"
    assert _apply(fanout, action, change) == (
        Result.TOO_LATE,
        "too late, both runs executed: tasks already started (extract=running) (re-checked under lock)",
    )


def test_by_default_the_backend_leaves_a_task_started_since_the_preview_alone(fanout: Db) -> None:
    """``remediate_started`` is off unless asked for, in the backend's own judgement too."""
    action = fanout.actions(Mode.FAIL)[0]
    preview = judge(action, read_state(fanout.engine, fanout.db.tables, action), remediate_started=False)
    assert preview.work is not None
    sql(
        fanout.url,
        "UPDATE task_instance SET state = 'running' WHERE run_id = :r AND task_id = 'extract'",
        r=action.run.run_id,
    )
    before = db_state(fanout.url)
    applied = DbBackend(fanout.engine, fanout.db.tables).apply(action, preview.work, lambda: Verdict(None))
    detail = "too late, both runs executed: tasks already started (extract=running) (re-checked under lock)"
    assert (applied.result, applied.detail, applied.committed_at) == (Result.TOO_LATE, detail, None)
    assert db_state(fanout.url) == before


def test_a_kept_run_stopped_since_the_preview_is_refused_under_lock(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    assert _apply(fanout, action, "UPDATE dag_run SET state = 'failed' WHERE run_id = :k") == (
        Result.SKIPPED,
        f"refused: the kept run {action.kept_run_id} was stopped before any task ran, state failed; "
        "this run is left alone (re-checked under lock)",
    )


def test_a_run_failed_since_the_preview_is_already_under_lock(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    assert _apply(fanout, action, "UPDATE dag_run SET state = 'failed' WHERE run_id = :r") == (
        Result.ALREADY,
        "the run is already failed (re-checked under lock)",
    )


def test_a_write_that_does_not_hold_is_rolled_back_whole(fanout: Db) -> None:
    """A task the UPDATE leaves unfinished (here a trigger in Airflow's database puts it back to
    scheduled, as a scheduler would) makes the read-back fail inside the transaction: it is rolled back,
    the run, its other task and the note included, and the result says what Airflow showed."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "CREATE FUNCTION keep_load() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "IF NEW.task_id = 'load' THEN NEW.state := 'scheduled'; END IF; RETURN NEW; END $$; "
        "CREATE TRIGGER keep_load BEFORE UPDATE ON task_instance FOR EACH ROW EXECUTE FUNCTION keep_load()",
    )
    before = db_state(fanout.url)
    result = _remediator(fanout, Mode.FAIL).execute(action)
    assert (result.result, result.retryable) == (Result.FAILED, True)
    assert result.detail == (
        "written (run -> failed; skipped: extract, load) but it did not hold: after the write Airflow shows "
        "load=scheduled (rolled back)"
    )
    assert result.committed_at is None
    assert db_state(fanout.url) == before


def test_a_fail_whose_run_does_not_stay_failed_is_rolled_back_whole(fanout: Db) -> None:
    """The run row is put back (a trigger in Airflow's database, as a scheduler's late write would):
    its tasks are skipped but the run is not failed, so the stop did not hold, and nothing of it lands."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(
        fanout.url,
        "CREATE FUNCTION keep_run() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "NEW.state := 'running'; RETURN NEW; END $$; "
        "CREATE TRIGGER keep_run BEFORE UPDATE ON dag_run FOR EACH ROW EXECUTE FUNCTION keep_run()",
    )
    before = db_state(fanout.url)
    result = _remediator(fanout, Mode.FAIL).execute(action)
    assert (result.result, result.retryable, result.committed_at) == (Result.FAILED, True, None)
    assert result.detail == (
        "written (run -> failed; skipped: extract, load) but it did not hold: after the write Airflow shows "
        "run state running (rolled back)"
    )
    assert db_state(fanout.url) == before


def test_a_run_without_a_state_is_failed_too(fanout: Db) -> None:
    """dag_run.state is nullable in Airflow's schema; a run with none is unfinished, so it is failed."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, "UPDATE dag_run SET state = NULL WHERE run_id = :r", r=action.run.run_id)
    assert _remediator(fanout, Mode.FAIL).execute(action).result is Result.DONE
    assert _run_row(fanout, action.run.run_id) == ("failed", NOW, NOW, NOW)


def test_another_dags_run_with_the_same_run_id_is_not_touched(fanout: Db) -> None:
    """run_id is unique per DAG only (a manual run_id can repeat across DAGs): the task UPDATEs match the
    DAG too. Here another DAG's queued run is given the duplicate's run_id (Airflow's foreign keys held
    off for that one statement pair)."""
    action = fanout.actions(Mode.FAIL)[0]
    other = next(r for r in db_state(fanout.url).values() if r.dag_id not in (action.dag_id, "orders_producer"))
    sql(
        fanout.url,
        "SET LOCAL session_replication_role = replica; "
        "UPDATE task_instance SET run_id = :r WHERE dag_id = :d AND run_id = :o; "
        "UPDATE dag_run SET run_id = :r WHERE dag_id = :d AND run_id = :o",
        r=action.run.run_id,
        d=other.dag_id,
        o=other.run_id,
    )
    before = _rows(fanout, "SELECT * FROM task_instance WHERE dag_id = :d ORDER BY task_id", d=other.dag_id)
    assert _remediator(fanout, Mode.FAIL).execute(action).result is Result.DONE
    assert _rows(fanout, "SELECT * FROM task_instance WHERE dag_id = :d ORDER BY task_id", d=other.dag_id) == before
    mine = "SELECT DISTINCT state FROM task_instance WHERE dag_id = :d AND run_id = :r"
    assert _rows(fanout, mine, d=action.dag_id, r=action.run.run_id) == [("skipped",)]


def test_the_write_holds_the_duplicates_rows_and_shares_the_kept_runs(fanout: Db) -> None:
    """While the write runs, another session can lock neither the duplicate's run nor its tasks (the
    scheduler and a worker's ti_run lock them before a task starts), and can only share the kept run's
    row: no other writer can stop the kept run before the commit, and its tasks still start."""
    action = fanout.actions(Mode.FAIL)[0]
    probes = {
        "duplicate run": ("SELECT 1 FROM dag_run WHERE run_id = %s FOR UPDATE NOWAIT", action.run.run_id),
        "duplicate tasks": ("SELECT 1 FROM task_instance WHERE run_id = %s FOR UPDATE NOWAIT", action.run.run_id),
        "kept run": ("SELECT 1 FROM dag_run WHERE run_id = %s FOR UPDATE NOWAIT", action.kept_run_id),
        "kept run shared": ("SELECT 1 FROM dag_run WHERE run_id = %s FOR SHARE NOWAIT", action.kept_run_id),
    }
    seen: dict[str, str] = {}

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if seen or not statement.startswith("UPDATE"):
            return
        other = psycopg2.connect(make_url(fanout.url).render_as_string(hide_password=False))
        try:
            for name, (query, run_id) in probes.items():
                try:
                    with other.cursor() as cur:
                        cur.execute(query, (run_id,))
                    seen[name] = "granted"
                except psycopg2.errors.LockNotAvailable:
                    seen[name] = "held"
                other.rollback()
        finally:
            other.close()

    remediator = _remediator(fanout, Mode.FAIL)
    event.listen(_backend_engine(remediator), "before_cursor_execute", before)
    assert remediator.execute(action).result is Result.DONE
    assert seen == {
        "duplicate run": "held",
        "duplicate tasks": "held",
        "kept run": "held",
        "kept run shared": "granted",
    }


# --- fencing inside the write transaction ----------------------------------------------------------


class _Ticks:
    """A monotonic clock that moves one second each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def _fenced(db: Db, action: Action, fence: Fence | None) -> tuple[Result, str]:
    before = db_state(db.url)
    result = _remediator(db, Mode.FAIL, fence=lambda: fence).execute(action)
    if result.result is not Result.DONE:
        assert db_state(db.url) == before, "nothing of a refused write lands"
    return result.result, result.detail


def test_no_fence_writes_nothing(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    assert _fenced(fanout, action, None) == (
        Result.FAILED,
        "not written: this replica's leader lease ended (or it is waiting to act): nothing written",
    )


def test_a_lease_that_ends_during_the_write_rolls_it_back(fanout: Db) -> None:
    action = fanout.actions(Mode.FAIL)[0]
    fence = Fence(term=1, ends=1.5, clock=_Ticks())  # valid when asked first, ended at the commit
    assert _fenced(fanout, action, fence) == (
        Result.FAILED,
        "not written: the leader lease ended during the write: rolled back",
    )


def test_the_write_commits_only_while_the_lock_backend_holds_the_leader_lock(fanout: Db) -> None:
    """The fence names the leader lock and the backend it was granted to: checked in pg_locks inside the
    write transaction. Held there, the write commits; not held (a terminated lock backend), nothing lands."""
    action, again = fanout.actions(Mode.FAIL)[:2]
    key = 4242
    holder = psycopg2.connect(make_url(fanout.url).render_as_string(hide_password=False))
    try:
        holder.autocommit = True
        with holder.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            (pid,) = cur.fetchone()
            unheld = _fenced(
                fanout, action, Fence(term=1, ends=math.inf, clock=time.monotonic, key=key, backend_pid=pid)
            )
            assert unheld == (
                Result.FAILED,
                f"not written: the leader lock is no longer granted to this replica's lock backend (pid {pid})",
            )
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
            held = Fence(term=1, ends=math.inf, clock=time.monotonic, key=key, backend_pid=pid)
            assert _fenced(fanout, again, held) == (Result.DONE, "run -> failed; skipped: extract, load")
    finally:
        holder.close()

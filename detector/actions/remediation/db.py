"""Backend ``db``: the remediation written straight into Airflow's metadata DB, in one short transaction.

The opt-in fast path (no HTTP, no token, no API server in the way). It makes the same state changes
as Airflow's ``set_dag_run_state_to_failed`` (airflow/api/common/mark_tasks.py, docs/explanation/airflow-internals.md,
"What marking a run failed does"):

- ``fail``: running / deferred / up_for_reschedule TIs -> failed, every other unfinished TI ->
  skipped, the run -> failed with ``end_date`` (and ``start_date`` = ``end_date`` if it never
  started: unlike Airflow, see ``_write``); TI timestamps as ``TaskInstance.set_state`` sets
  them (start_date and end_date filled if empty, duration);
- ``skip``: every unfinished TI -> skipped; the run is left to the scheduler, which ends it;
- both: the note, upserted into ``dag_run_note`` with ``user_id`` NULL (no Airflow user did it).

After the write, still inside the transaction, the run is read again and judged by
``detector.actions.remediation.readback`` like the api backend's writes: tasks the write stopped although
they had started (only with ``remediate_started``) make the result ``caught_after_start``, and a
task left unfinished rolls the transaction back (``failed``).

Safety: the run row and then its TIs are locked ``FOR UPDATE`` and the guard is judged again on
those locked rows (and the kept run's row ``FOR SHARE``: it must still stand, ``judge_kept``), so a
task that started a microsecond before the lock is seen (TOO_LATE) and one
that tries to start after it waits for the commit and then finds itself skipped (the Execution
API's ``ti_run`` only moves QUEUED -> RUNNING). Every UPDATE also repeats the expected states in
its WHERE clause. ``lock_timeout`` / ``statement_timeout`` are ``SET LOCAL`` (transaction-scoped,
so safe behind PgBouncer's transaction pooling).

Fencing (docs/explanation/remediation.md, Leadership and fencing): the transaction starts only with a valid
leader fence, and its last statement before COMMIT checks, in ``pg_locks``, that the leader lock is
still granted to the lock connection's backend (the pid read at acquisition); if not, or if the
lease ended meanwhile, it rolls back (``LeadershipLost``): nothing of it lands.

What it bypasses (see docs/explanation/remediation.md): the API server's listener hooks
(``on_dag_run_failed``), the ``log`` (audit) row, and teardown-task special cases (a teardown TI
is skipped like any other; the duplicate ran no setup).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, or_, select, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite

from detector.actions.remediation.guarded import (
    FAIL_AS_FAILED_STATES,
    FINISHED_TI_STATES,
    Applied,
    Recheck,
    Work,
    judge,
    judge_kept,
    now_utc,
    read_kept,
)
from detector.actions.remediation.readback import read_back
from detector.core.fence import UNFENCED, Fence, FenceSource, LeadershipLost
from detector.core.model import STARTED_TI_STATES
from detector.core.plan import Action
from detector.core.ports import Result
from detector.metadb import leader_lock, run_state
from detector.metadb.engine import refuse_standby
from detector.metadb.run_state import TaskState
from detector.metadb.schema import AirflowTables


class DbBackend:
    name = "db"

    def __init__(
        self,
        engine: Engine,
        tables: AirflowTables,
        *,
        remediate_started: bool = False,
        lock_timeout_ms: int = 2000,
        statement_timeout_ms: int = 5000,
        clock: Callable[[], datetime] = now_utc,
        fence: FenceSource = lambda: UNFENCED,
    ) -> None:
        self.engine = engine
        self.fence = fence
        self.tables = tables
        self.remediate_started = remediate_started
        self.lock_timeout_ms = lock_timeout_ms
        self.statement_timeout_ms = statement_timeout_ms
        self.clock = clock

    def apply(self, action: Action, work: Work, recheck: Recheck) -> Applied:
        """Re-judge under the row locks, then write; the unlocked ``work`` is only a preview."""
        fence = self._valid_fence()
        with self.engine.begin() as conn:
            self._set_timeouts(conn)
            refuse_standby(conn, "DUPGUARD_DATABASE_URL", "writes")  # loud and retryable (not read-only errors)
            current = run_state.run_state(conn, self.tables, action.dag_id, action.run.run_id, lock=True)
            verdict = judge(action, current, remediate_started=self.remediate_started)
            if verdict.work is not None:  # the kept run too, its row held until the commit
                verdict = judge_kept(action, read_kept(conn, self.tables, action, lock=True)) or verdict
            if verdict.work is None:
                assert verdict.result is not None
                return Applied(verdict.result, verdict.detail + " (re-checked under lock)")
            locked = verdict.work
            now = self.clock()
            self._write(conn, action, locked, now)
            # The same read-back as the api backend, inside the transaction: under the row locks no task
            # can start between the judgement and the write, so a started task here is one the operator
            # chose to stop (remediate_started), and an unfinished one means a write missed it.
            after = run_state.run_state(conn, self.tables, action.dag_id, action.run.run_id)
            checked = read_back(
                action.mode, (*locked.to_fail, *locked.to_skip), locked.describe(), after, ran=locked.ran
            )
            if checked.result is Result.FAILED:
                conn.rollback()  # never commit a half-done stop
                return Applied(Result.FAILED, checked.detail + " (rolled back)")
            self._check_fence(conn, fence)  # last, right before COMMIT: raising rolls everything back
        return Applied(checked.result, checked.detail, committed_at=now_utc(), started_tasks=checked.started)

    def _valid_fence(self) -> Fence:
        fence = self.fence()
        if fence is None or not fence.valid():
            raise LeadershipLost("this replica's leader lease ended (or it is waiting to act): nothing written")
        return fence

    def _check_fence(self, conn: Connection, fence: Fence) -> None:
        """Still the leader, in this very transaction: the lease has not ended and the lock is still
        granted to the backend that took it (a terminated lock backend frees it at once)."""
        pid = fence.backend_pid
        if fence.key is not None and pid is not None and not leader_lock.advisory_lock_granted_to(conn, fence.key, pid):
            raise LeadershipLost(f"the leader lock is no longer granted to this replica's lock backend (pid {pid})")
        if not fence.valid():
            raise LeadershipLost("the leader lease ended during the write: rolled back")

    def _set_timeouts(self, conn: Connection) -> None:
        """``SET LOCAL lock_timeout, statement_timeout``: a blocked write gives up instead of queueing."""
        if conn.dialect.name != "postgresql":
            return
        # set_config(..., is_local => true) is SET LOCAL: it ends with this transaction.
        conn.execute(
            select(
                func.set_config("lock_timeout", f"{self.lock_timeout_ms}ms", True),
                func.set_config("statement_timeout", f"{self.statement_timeout_ms}ms", True),
            )
        )

    def _write(self, conn: Connection, action: Action, work: Work, now: datetime) -> None:
        """Fail or skip the duplicate's unstarted task instances, fail the run, note why."""
        t = self.tables
        dr = t.dag_run
        if work.to_fail:
            self._set_tis(conn, action, work.to_fail, "failed", FAIL_AS_FAILED_STATES, now)
        if work.to_skip:
            self._set_tis(conn, action, work.to_skip, "skipped", None, now)
        if work.fail_run:
            conn.execute(
                update(dr)
                .where(dr.c.id == work.run_pk, or_(dr.c.state.is_(None), dr.c.state.not_in(["failed", "success"])))
                # A run stopped before it started gets start_date = end_date, as the guard gives its runs:
                # Airflow's own set-failed leaves it NULL (DagRun.set_state, QUEUED -> FAILED sets only
                # end_date), and Airflow 3.0.6-3.3.2 then answer HTTP 500 for every asset event the run
                # consumed, the kept run's too (apache/airflow#71360, docs/explanation/remediation.md).
                .values(state="failed", start_date=func.coalesce(dr.c.start_date, now), end_date=now, updated_at=now)
            )
        self._upsert_note(conn, work.run_pk, action.note, now)

    def _set_tis(
        self,
        conn: Connection,
        action: Action,
        tis: Sequence[TaskState],
        state: str,
        only_from: frozenset[str] | None,
        now: datetime,
    ) -> None:
        """Set these task instances of the duplicate to ``state``: never a finished one, nor a started
        one unless allowed."""
        ti = self.tables.task_instance
        keys = [(x.task_id, x.map_index) for x in tis]
        # Never touch a finished TI, and never one that started unless the operator opted in.
        excluded = set(FINISHED_TI_STATES)
        if not self.remediate_started:
            excluded |= STARTED_TI_STATES
        state_ok = (
            ti.c.state.in_(sorted(only_from))
            if only_from is not None
            else or_(ti.c.state.is_(None), ti.c.state.not_in(sorted(excluded)))
        )
        start = func.coalesce(ti.c.start_date, now)
        end = func.coalesce(ti.c.end_date, now)
        values: dict[str, Any] = {
            "state": state,
            "start_date": start,
            "end_date": end,
            "updated_at": now,
        }
        if conn.dialect.name == "postgresql":
            values["duration"] = func.extract("epoch", end - start)
        conn.execute(
            update(ti)
            .where(
                and_(ti.c.dag_id == action.dag_id, ti.c.run_id == action.run.run_id),
                tuple_(ti.c.task_id, ti.c.map_index).in_(keys),
                state_ok,
            )
            .values(**values)
        )

    def _upsert_note(self, conn: Connection, run_pk: int, note: str, now: datetime) -> None:
        """The run's note (dag_run_note pkey): what the operator sees on the run page."""
        table = self.tables.dag_run_note
        row = {"dag_run_id": run_pk, "user_id": None, "content": note, "created_at": now, "updated_at": now}
        dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
        stmt = dialect.insert(table).values(**row)
        conn.execute(
            stmt.on_conflict_do_update(
                index_elements=[table.c.dag_run_id],
                set_={"content": stmt.excluded.content, "updated_at": stmt.excluded.updated_at, "user_id": None},
            )
        )

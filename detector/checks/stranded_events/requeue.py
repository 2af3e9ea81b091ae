"""The stranded-events repair's write: the missing ``asset_dag_run_queue`` row, in one short transaction.

Opt-in (``DUPGUARD_REPAIR_STRANDED=requeue``). Inside the transaction the DAG is read again and planned
again (``detector.checks.stranded_events.rule_repair``): if a run consumed the events meanwhile, a queue row exists, a
later run exists or the window is no longer exactly the set, nothing is written. The INSERT is ``ON
CONFLICT DO NOTHING``: a row the scheduler or a new event wrote first wins (0 rows: nothing written).
After the INSERT the DAG is read once more (READ COMMITTED: a new snapshot): a run the scheduler
committed between the first read and the INSERT (it took a new event's row of this asset and deleted
it) rolls the write back, since the row would make a second run consume the same events. After the
INSERT no other transaction can queue this (asset, DAG) until the commit (it waits on the row), which
is why only DAGs on one asset are repaired.

Fenced like the db remediation (``detector.actions.remediation.db``): started only with a valid
leader fence, and the last statement before COMMIT checks in ``pg_locks`` that the leader lock is still
granted to the lock connection's backend, and that the lease has not ended; otherwise it rolls back
(``LeadershipLost``). ``lock_timeout`` / ``statement_timeout`` are ``SET LOCAL``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, select

from detector.checks.stranded_events import statements
from detector.checks.stranded_events.rule import StrandedSet
from detector.checks.stranded_events.rule_repair import Refusal, Requeue, plan_requeue, requeue_at
from detector.core.fence import UNFENCED, Fence, FenceSource, LeadershipLost
from detector.metadb import leader_lock
from detector.metadb.engine import refuse_standby
from detector.metadb.schema import AirflowTables


@dataclass(frozen=True)
class Written:
    outcome: str  # requeued, skipped, refused
    detail: str
    plan: Requeue | None = None


def plan_now(conn: Connection, tables: AirflowTables, s: StrandedSet) -> Requeue | Refusal:
    """The plan on what ``conn`` sees now (the dry-run's and the write's judgement)."""
    return plan_requeue(s, statements.stranded_repair_state(conn, tables, s, requeue_at(s)))


class RequeueWriter:
    def __init__(
        self,
        engine: Engine,
        tables: AirflowTables,
        *,
        fence: FenceSource = lambda: UNFENCED,
        lock_timeout_ms: int = 2000,
        statement_timeout_ms: int = 5000,
    ) -> None:
        self.engine, self.tables, self.fence = engine, tables, fence
        self.lock_timeout_ms, self.statement_timeout_ms = lock_timeout_ms, statement_timeout_ms

    def write(self, s: StrandedSet) -> Written:
        """Re-plan on the committed state, write, re-read, check the fence, commit. Raises
        ``LeadershipLost`` (nothing written) and database errors (rolled back)."""
        fence = self.fence()
        if fence is None or not fence.valid():
            raise LeadershipLost("this replica's leader lease ended (or it is waiting to act): nothing written")
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # set_config(..., true) is SET LOCAL
                conn.execute(
                    select(
                        func.set_config("lock_timeout", f"{self.lock_timeout_ms}ms", True),
                        func.set_config("statement_timeout", f"{self.statement_timeout_ms}ms", True),
                    )
                )
            refuse_standby(conn, "DUPGUARD_DATABASE_URL", "writes")
            plan = plan_now(conn, self.tables, s)
            if isinstance(plan, Refusal):
                return Written(plan.outcome, plan.reason + " (re-read before writing: nothing written)")
            if statements.requeue_stranded(conn, self.tables, plan) != len(plan.asset_ids):
                conn.rollback()
                return Written("skipped", "a queue row of the DAG appeared meanwhile: nothing written")
            after = statements.stranded_repair_state(conn, self.tables, s, plan.created_at)
            if after.consumed or after.later_runs:
                conn.rollback()
                return Written("skipped", "a run of the DAG took these events meanwhile: rolled back, nothing written")
            _check_fence(conn, fence)  # last, right before COMMIT: raising rolls everything back
        return Written("requeued", plan.describe(), plan)


def _check_fence(conn: Connection, fence: Fence) -> None:
    pid = fence.backend_pid
    if fence.key is not None and pid is not None and not leader_lock.advisory_lock_granted_to(conn, fence.key, pid):
        raise LeadershipLost(f"the leader lock is no longer granted to this replica's lock backend (pid {pid})")
    if not fence.valid():
        raise LeadershipLost("the leader lease ended during the write: rolled back")

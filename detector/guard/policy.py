"""dupguard in-scheduler guard: an Airflow cluster policy that creates duplicate asset runs skipped.

Airflow 3.0.x/3.1.x can create the same asset-triggered run twice when two HA schedulers race
(apache/airflow#54491): scheduler B reads the asset queue without a lock, waits for the DagModel row
lock that scheduler A holds until A's run is committed, then creates a second run with the same
run_after from its stale read. Because the lock serialises the two creators, A's run is committed
and visible when B creates its task instances, and Airflow calls ``task_instance_mutation_hook``
for each of them inside B's transaction (``DagRun.verify_integrity`` -> ``_get_task_creator``,
airflow/models/dagrun.py). This hook recognises such a run and creates its task instances SKIPPED,
so nothing of the duplicate runs; the run finishes on its own and the dupguard sidecar reports it
as "prevented". The run gets a note naming the run that was kept.

What it acts on (everything else returns at once, untouched):

* only brand-new task instances: run_id starting ``asset_triggered__``, state NULL, try_number 0,
  and not yet a database row (a cleared, refreshed or re-mapped task instance is never touched);
* Airflow 3.0.x and 3.1.x: the run is a duplicate when another ``asset_triggered`` run of the same
  dag_id with the same run_after and a LOWER id is already committed (the earlier run is kept, the
  same keep rule as the sidecar's);
* Airflow 3.2.x, partitioned runs only: the pending ``asset_partition_dag_run`` row this scheduler is
  creating the run from has meanwhile been consumed by a committed run of the same dag_id and
  partition_key with a lower id, whose consumed asset events are exactly that row's events. If the
  other scheduler has not committed yet, the guard cannot see it and does nothing;
* Airflow 3.2.x non-partitioned runs and Airflow 3.3+: nothing (Airflow itself locks those paths).

Safety: at most one indexed query per new asset run, inside a SAVEPOINT of the scheduler's own
session (a failing query rolls back to it and leaves the scheduler's transaction usable), never a
commit or a flush; the decision is cached per (dag_id, run_id) in a small LRU, so later calls for
the same run (mapped task instances expanded later, a new DAG version) cost no query; any error is
logged (rate-limited) and leaves the task instance untouched. Only the standard library and Airflow
(with its SQLAlchemy) are used, so this file works both as an installed ``airflow.policy`` entry
point and pasted into ``airflow_local_settings.py``. Every module-level name is either a module,
an import that Airflow's settings module already holds, a ``_dupguard`` name, or the hook itself:
Airflow copies the names of ``airflow_local_settings`` into ``airflow.settings``.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

try:
    from airflow.policies import hookimpl as _dupguard_hookimpl
except ImportError:  # read outside Airflow (docs, tests): the pluggy marker is then irrelevant

    def _dupguard_hookimpl(function: Any) -> Any:
        return function


_DUPGUARD_RUN_ID_PREFIX = "asset_triggered__"
_DUPGUARD_NOTE = (
    "dupguard guard skipped this run as a duplicate of {kept} (HA scheduler race, apache/airflow#54491)"
)
_DUPGUARD_NOTE_LIMIT = 1000  # dag_run_note.content is varchar(1000)
_DUPGUARD_NOT_A_DUPLICATE = ""
_DUPGUARD_LOG = logging.getLogger("dupguard.guard")


class _DupguardGuard:
    """The hook's state: the per-run decision cache and the rate limit of error logs."""

    def __init__(self, cache_size: int = 1024, error_log_interval: float = 300.0) -> None:
        self.cache_size = cache_size
        self.error_log_interval = error_log_interval
        self._decisions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self._family: str | None = None
        self._errors_unlogged = 0
        self._last_error_log = float("-inf")
        self.queries = 0  # lookups run against the database (tests and the benchmark read it)
        self.skipped_runs = 0

    # The hook ------------------------------------------------------------------------------------
    def mutate(self, task_instance: Any) -> None:
        """Skip a brand-new task instance of a duplicate asset run; never raises."""
        try:
            self._mutate(task_instance)
        except Exception:  # noqa: BLE001 - fail open: the scheduler must never see the guard's error
            self._log_error()

    def _mutate(self, ti: Any) -> None:
        run_id = ti.run_id
        if not run_id or not run_id.startswith(_DUPGUARD_RUN_ID_PREFIX):
            return
        if ti.state is not None or (ti.try_number or 0) != 0:
            return
        family = self.family()
        if family is None:
            return
        from sqlalchemy import inspect

        if inspect(ti).has_identity:  # already a row: cleared, refreshed or being re-mapped
            return
        key = (ti.dag_id, run_id)
        with self._lock:
            kept = self._decisions.get(key)
            if kept is not None:
                self._decisions.move_to_end(key)
        if kept is None:
            try:
                kept = self._decide(ti.dag_id, run_id, family)
            except Exception:
                # Fail open once per run: the run's other task instances are left alone without
                # repeating a failing query for each of them.
                self._remember(key, _DUPGUARD_NOT_A_DUPLICATE)
                raise
            if kept is None:  # not decidable here (not the creating session): leave it
                return
        if kept:
            from airflow.utils.state import TaskInstanceState

            ti.state = TaskInstanceState.SKIPPED

    # The decision --------------------------------------------------------------------------------
    def family(self) -> str | None:
        """Which of Airflow's race shapes applies: "dagmodel-lock" (3.0, 3.1), "partitioned" (3.2)."""
        if self._family is None:
            import airflow

            major, minor = (int(part) for part in airflow.__version__.split(".")[:2])
            if major == 3 and minor in (0, 1):
                self._family = "dagmodel-lock"
            elif (major, minor) == (3, 2):
                self._family = "partitioned"
            else:
                self._family = "none"
        return None if self._family == "none" else self._family

    def _decide(self, dag_id: str, run_id: str, family: str) -> str | None:
        """The kept run's run_id if this run is a duplicate, "" if not, None if undecidable here."""
        session = self.creating_session()
        if session is None:
            return None
        run = self.find_run(session, dag_id, run_id)
        if run is None:
            return None
        run_pk, run_after, partition_key = run
        statement = None
        if family == "dagmodel-lock":
            statement = self.asset_statement(dag_id, run_after, run_pk)
        elif partition_key is not None:  # 3.2 locks its non-partitioned path itself
            stale = self.stale_partition_rows(session, dag_id, partition_key)
            if stale:
                statement = self.partitioned_statement(dag_id, partition_key, run_pk, stale)
        kept, has_note = (
            (_DUPGUARD_NOT_A_DUPLICATE, True) if statement is None else self._lookup(session, statement)
        )
        if kept and not has_note and not self.note_pending(session, run_pk):
            self.add_note(session, run_pk, kept)
        if kept:
            self.skipped_runs += 1
            _DUPGUARD_LOG.warning(
                "dupguard guard: creating run %s of %s with every task skipped: duplicate of %s "
                "(HA scheduler race, apache/airflow#54491)",
                run_id,
                dag_id,
                kept,
            )
        self._remember((dag_id, run_id), kept)
        return kept

    def _lookup(self, session: Any, statement: Any) -> tuple[str, bool]:
        """Run the statement in a SAVEPOINT of the scheduler's transaction: (kept run_id, has note)."""
        self.queries += 1
        connection = session.connection()
        savepoint = connection.begin_nested()
        try:
            row = connection.execute(statement).first()
        except BaseException:
            savepoint.rollback()  # the scheduler's transaction stays usable
            raise
        savepoint.commit()  # RELEASE SAVEPOINT: commits nothing
        if row is None:
            return _DUPGUARD_NOT_A_DUPLICATE, True
        return str(row[0]), bool(row[1])

    def _remember(self, key: tuple[str, str], kept: str) -> None:
        with self._lock:
            self._decisions[key] = kept
            self._decisions.move_to_end(key)
            while len(self._decisions) > self.cache_size:
                self._decisions.popitem(last=False)

    # Helpers: each one Airflow lookup or statement (tests replace one to force a failure) -------
    def creating_session(self) -> Any:
        """This thread's scoped Airflow session, only if it already exists (never opens one)."""
        from airflow import settings

        registry = getattr(getattr(settings, "Session", None), "registry", None)
        if registry is None or not registry.has():
            return None
        return registry()

    def find_run(self, session: Any, dag_id: str, run_id: str) -> tuple[int, Any, str | None] | None:
        """(id, run_after, partition_key) of the run being created, from the session's identity map.

        Found only in a session that holds the flushed run: the creating transaction, or a scheduler
        session working on the run later (mapped task instances expanded later). Anywhere else the
        guard does nothing. Attributes are read from ``__dict__`` so nothing is lazily loaded.
        """
        from airflow.models.dagrun import DagRun

        for obj in list(session.identity_map.values()):
            if isinstance(obj, DagRun):
                state = obj.__dict__
                if (
                    state.get("run_id") == run_id
                    and state.get("dag_id") == dag_id
                    and state.get("id") is not None
                ):
                    if "run_after" not in state:
                        return None
                    return int(state["id"]), state["run_after"], state.get("partition_key")
        return None

    def stale_partition_rows(self, session: Any, dag_id: str, partition_key: str) -> list[int]:
        """Ids of asset_partition_dag_run rows this session read as pending for (dag_id, partition_key)."""
        from airflow.models.asset import AssetPartitionDagRun

        ids = []
        for obj in list(session.identity_map.values()):
            if isinstance(obj, AssetPartitionDagRun):
                state = obj.__dict__
                if (
                    state.get("target_dag_id") == dag_id
                    and state.get("partition_key") == partition_key
                    and "created_dag_run_id" in state
                    and state["created_dag_run_id"] is None
                ):
                    ids.append(int(state["id"]))
        return ids

    def has_note_expression(self, run_pk: int) -> Any:
        from airflow.models.dagrun import DagRunNote
        from sqlalchemy import select

        note = DagRunNote.__table__
        return select(note.c.dag_run_id).where(note.c.dag_run_id == run_pk).exists()

    def asset_statement(self, dag_id: str, run_after: Any, run_pk: int) -> Any:
        """3.0/3.1: the earliest committed asset run of the DAG with the same run_after and a lower id.

        Served by idx_dag_run_run_after / idx_dag_run_dag_id (facts section 1.5).
        """
        from airflow.models.dagrun import DagRun
        from sqlalchemy import select

        dr = DagRun.__table__
        return (
            select(dr.c.run_id, self.has_note_expression(run_pk))
            .where(
                dr.c.dag_id == dag_id,
                dr.c.run_after == run_after,
                dr.c.run_type == "asset_triggered",
                dr.c.id < run_pk,
            )
            .order_by(dr.c.id)
            .limit(1)
        )

    def partitioned_statement(
        self, dag_id: str, partition_key: str, run_pk: int, stale_ids: list[int]
    ) -> Any:
        """3.2: the committed run that consumed one of this session's stale pending partition rows.

        Its consumed events must equal the row's events (partitioned_asset_key_log), which are what this
        run is about to consume. Primary-key lookups on asset_partition_dag_run and dag_run; the event
        comparison only runs when such a run exists (3.2.2 has no index on the key log's row id).
        """
        from airflow.models.asset import AssetPartitionDagRun, PartitionedAssetKeyLog
        from airflow.models.asset import association_table as dagrun_asset_event
        from airflow.models.dagrun import DagRun
        from sqlalchemy import and_, exists, select

        dr, apdr = DagRun.__table__, AssetPartitionDagRun.__table__
        pakl, consumed = PartitionedAssetKeyLog.__table__, dagrun_asset_event
        row_event_not_consumed = exists().where(
            pakl.c.asset_partition_dag_run_id == apdr.c.id,
            ~exists().where(consumed.c.dag_run_id == dr.c.id, consumed.c.event_id == pakl.c.asset_event_id),
        )
        consumed_event_not_in_row = exists().where(
            consumed.c.dag_run_id == dr.c.id,
            ~exists().where(
                pakl.c.asset_partition_dag_run_id == apdr.c.id, pakl.c.asset_event_id == consumed.c.event_id
            ),
        )
        return (
            select(dr.c.run_id, self.has_note_expression(run_pk))
            .select_from(apdr.join(dr, and_(dr.c.id == apdr.c.created_dag_run_id)))
            .where(
                apdr.c.id.in_(stale_ids),
                apdr.c.target_dag_id == dag_id,
                apdr.c.partition_key == partition_key,
                dr.c.dag_id == dag_id,
                dr.c.partition_key == partition_key,
                dr.c.run_type == "asset_triggered",
                dr.c.id < run_pk,
                ~row_event_not_consumed,
                ~consumed_event_not_in_row,
            )
            .order_by(dr.c.id)
            .limit(1)
        )

    def note_pending(self, session: Any, run_pk: int) -> bool:
        from airflow.models.dagrun import DagRunNote

        return any(
            isinstance(obj, DagRunNote) and obj.__dict__.get("dag_run_id") == run_pk for obj in session.new
        )

    def add_note(self, session: Any, run_pk: int, kept_run_id: str) -> None:
        """The run note, added to the scheduler's session: written by the scheduler's own flush."""
        from airflow.models.dagrun import DagRunNote

        text = _DUPGUARD_NOTE.format(kept=kept_run_id)[:_DUPGUARD_NOTE_LIMIT]
        note = DagRunNote(content=text)
        note.dag_run_id = run_pk
        session.add(note)

    def _log_error(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._errors_unlogged += 1
            if now - self._last_error_log < self.error_log_interval:
                return
            count, self._errors_unlogged, self._last_error_log = self._errors_unlogged, 0, now
        _DUPGUARD_LOG.warning(
            "dupguard guard failed %d time(s) since the last report; task instances left untouched",
            count,
            exc_info=True,
        )


def _dupguard_enable_on_creation() -> None:
    """Make Airflow call the hook when it creates task instances, also when loaded as a plugin.

    ``DagRun.verify_integrity`` skips the hook while ``airflow.settings.task_instance_mutation_hook
    .is_noop`` is True, and Airflow clears that flag only after importing an airflow_local_settings
    module (airflow/settings.py ``import_local_settings``), not for ``airflow.policy`` entry points.
    """
    settings = sys.modules.get("airflow.settings")
    dispatcher = getattr(settings, "task_instance_mutation_hook", None)
    if dispatcher is not None and getattr(dispatcher, "is_noop", False):
        dispatcher.is_noop = False


_dupguard_guard = _DupguardGuard()


def _dupguard_task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """dupguard's hook body, for an existing task_instance_mutation_hook to call (see docs/guard.md)."""
    _dupguard_guard.mutate(task_instance)


@_dupguard_hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Airflow cluster policy (``dag_run`` is passed by Airflow 3.3+ only, and not needed)."""
    _dupguard_guard.mutate(task_instance)


_dupguard_enable_on_creation()

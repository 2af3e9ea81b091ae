"""dupguard in-scheduler guard: an Airflow cluster policy that creates duplicate asset runs skipped.

Airflow 3.0.x/3.1.x can create the same asset-triggered run twice when two HA schedulers race
(apache/airflow#54491): scheduler B reads the asset queue without a lock, waits for the DagModel row
lock that scheduler A holds until A's run is committed, then creates a second run with the same
run_after from its stale read. Because the lock serialises the two creators, A's run is committed
and visible when B creates its task instances, and Airflow calls ``task_instance_mutation_hook``
for each of them inside B's transaction (``DagRun.verify_integrity`` -> ``_get_task_creator``,
airflow/models/dagrun.py). This hook recognises such a run and creates its task instances SKIPPED
and the run itself finished (``success``, started and ended at once, so the scheduler never starts
it and sends no DAG callback for it); nothing of the duplicate runs, the run gets a note naming the
run that was kept, and the dupguard sidecar reports it as "prevented" (it recognises the note).

What it acts on (everything else returns at once, untouched):

* only brand-new task instances: run_id starting ``asset_triggered__``, state NULL, try_number 0,
  and not yet a database row (a cleared, refreshed or re-mapped task instance is never touched);
* Airflow 3.0.x and 3.1.x: the run is a duplicate when a committed ``asset_triggered`` run of the
  same dag_id with a LOWER id and the same or a later run_after already consumed every asset event
  this run is about to consume (the exact duplicate, same run_after; or the overlap duplicate, whose
  scheduler read the queue earlier). The earlier run is kept, the same keep rule as the sidecar's.
  With ``[scheduler] use_row_level_locking = False`` nothing serialises the creators, so the guard
  takes a per-DAG advisory lock first (below);
* Airflow 3.2.x, partitioned runs only: the pending ``asset_partition_dag_run`` row this scheduler is
  creating the run from has meanwhile been consumed by a committed run of the same dag_id and
  partition_key with a lower id, whose consumed asset events are exactly that row's events. 3.2 does
  not serialise these creators, so the guard first takes a transaction-scoped advisory lock on
  (dag_id, partition_key): a second creator waits until the first one commits, then sees its run;
* Airflow 3.2.x non-partitioned runs and Airflow 3.3+: nothing (Airflow itself locks those paths).

The advisory lock (PostgreSQL) is polled with ``pg_try_advisory_xact_lock`` for at most
``DUPGUARD_GUARD_LOCK_WAIT_SECONDS`` (default 5) per scheduler transaction; a creator that cannot
take it in time lets its run through untouched (fail open, logged) and the sidecar handles it.

Safety: one small indexed query per new asset run, a second one only in a race (plus the lock round
trip where a lock is taken), inside a SAVEPOINT of the scheduler's own session (a failing query
rolls back to it and leaves the scheduler's transaction usable), never a commit or a flush; the
decision is cached per (dag_id, run_id) in a small LRU, so later calls for the same run (mapped task
instances expanded later, a new DAG version) cost no query; any error is logged (rate-limited) and
leaves the task instance untouched. Only the standard library and Airflow (with its SQLAlchemy) are
used, so this file works both as an installed ``airflow.policy`` entry point and pasted into
``airflow_local_settings.py``. Every module-level name is either a module, an import that Airflow's
settings module already holds, a ``_dupguard`` name, or the hook itself: Airflow copies the names of
``airflow_local_settings`` into ``airflow.settings``.
"""

from __future__ import annotations

import datetime as _dupguard_datetime
import hashlib as _dupguard_hashlib
import logging
import os
import sys
import threading
import time
import weakref as _dupguard_weakref
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
# How long a creator waits for another scheduler creating the same (dag, key) to commit (seconds).
_DUPGUARD_LOCK_WAIT_ENV = "DUPGUARD_GUARD_LOCK_WAIT_SECONDS"
_DUPGUARD_LOCK_WAIT_DEFAULT = 5.0
# The wait happens inside the scheduler's critical section: its DagModel row locks (3.0/3.1) and its
# loop are held meanwhile, and its job heartbeat waits too. Other schedulers call a scheduler dead
# after [scheduler] scheduler_health_check_threshold (30 s by default) and reset its tasks; a third
# of that leaves the rest of the scheduling loop its time.
_DUPGUARD_LOCK_WAIT_MAX = 10.0
# Airflow's lower bound of an asset run's event window (date.min), as an aware datetime. timezone.utc
# rather than datetime.UTC: Airflow 3.0 still runs on Python 3.9 and 3.10.
_DUPGUARD_UTC = _dupguard_datetime.timezone.utc  # noqa: UP017
_DUPGUARD_DATE_MIN = _dupguard_datetime.datetime(1, 1, 1, tzinfo=_DUPGUARD_UTC)


class _DupguardGuard:
    """The hook's state: the per-run decision cache and the rate limit of error logs."""

    def __init__(self, cache_size: int = 1024, error_log_interval: float = 300.0) -> None:
        self.cache_size = cache_size
        self.error_log_interval = error_log_interval
        self.lock_wait = _dupguard_lock_wait()
        self._decisions: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self._family: str | None = None
        self._row_locking: bool | None = None
        self._reads_aliases: bool | None = None
        self._errors_unlogged = 0
        self._last_error_log = float("-inf")
        self._timeouts_unlogged = 0
        self._last_timeout_log = float("-inf")
        self.queries = 0  # decisions looked up in the database: one per new run (tests, benchmark)
        self.statements = 0  # statements those lookups ran (the precheck, and the statement in a race)
        self.skipped_runs = 0
        # One wait budget per scheduler transaction: a transaction that meets another scheduler's
        # long transaction waits lock_wait seconds in all, not lock_wait for each of its runs.
        self._wait_deadlines: Any = _dupguard_weakref.WeakKeyDictionary()
        # The duplicates each scheduler transaction created (and skipped): a cached duplicate is
        # skipped only there. After that transaction its task instances are the scheduler's (a
        # cleared duplicate runs as asked, mapped tasks expanded later included).
        self._created_here: Any = _dupguard_weakref.WeakKeyDictionary()
        self.lock_waits = 0  # creators that found the (dag, key) lock taken and waited for it
        self.lock_timeouts = 0  # ... and gave up after lock_wait seconds (the run was let through)

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
        elif kept and not self.created_here(key):  # a later transaction of a duplicate: leave it
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

    def row_locking(self) -> bool:
        """Airflow's ``[scheduler] use_row_level_locking`` (default True), read once."""
        if self._row_locking is None:
            from airflow.configuration import conf

            self._row_locking = conf.getboolean("scheduler", "use_row_level_locking", fallback=True)
        return self._row_locking

    def reads_aliases(self) -> bool:
        """Whether Airflow's asset run consumes the events of the DAG's asset aliases too (3.1+; 3.0
        reads its scheduled assets only), read once."""
        if self._reads_aliases is None:
            import airflow

            major, minor = (int(part) for part in airflow.__version__.split(".")[:2])
            self._reads_aliases = (major, minor) >= (3, 1)
        return self._reads_aliases

    def _decide(self, dag_id: str, run_id: str, family: str) -> str | None:
        """The kept run's run_id if this run is a duplicate, "" if not, None if undecidable here."""
        session = self.creating_session()
        if session is None:
            return None
        found = self.find_run(session, dag_id, run_id)
        if found is None:
            return None
        run, (run_pk, run_after, partition_key) = found
        precheck: Any = None
        statement: Any = None
        lock_key: tuple[str, ...] | None = None
        if family == "dagmodel-lock":
            if not self.row_locking():
                # Without the DagModel row lock nothing serialises two creators of one DAG's asset runs
                # (docs/explanation/airflow-internals.md, "The scheduler's run-creation step"): the guard
                # does it itself, per DAG.
                lock_key = (dag_id,)
            lower_id_only = lock_key is None
            precheck = self.asset_precheck(dag_id, run_after, run_pk, lower_id_only)

            def statement() -> Any:  # built only in a race: building it costs as much as a round trip
                return self.asset_statement(dag_id, run_after, run_pk, lower_id_only=lower_id_only)

        elif partition_key is not None:  # 3.2 locks its non-partitioned path itself
            stale = self.stale_partition_rows(session, dag_id, partition_key)
            if stale:
                precheck = self.partitioned_precheck(run_pk, stale)

                def statement() -> Any:
                    return self.partitioned_statement(dag_id, partition_key, run_pk, stale)

                # 3.2's partitioned path takes no lock at all (docs/explanation/airflow-internals.md,
                # "Partitioned runs (3.2+)"): serialise the creators of one (dag, partition key), so
                # the second one sees the first one's committed run.
                lock_key = (dag_id, partition_key)
        if statement is None:
            kept, has_note, has_tis = _DUPGUARD_NOT_A_DUPLICATE, True, True
        else:
            kept, has_note, has_tis = self._lookup(session, precheck, statement, lock_key)
        if kept and has_tis:
            # Its task instances are rows: not its creating transaction but a later one (a mapped
            # task expanded, a cleared duplicate run again). The run is the scheduler's by now.
            kept = _DUPGUARD_NOT_A_DUPLICATE
        if kept:
            self.mark_duplicate(session, run, run_pk, kept, add_note=not has_note, finish=not has_tis)
            self.skipped_runs += 1
            with self._lock:
                self._created_here.setdefault(session.get_transaction(), set()).add((dag_id, run_id))
            _DUPGUARD_LOG.warning(
                "dupguard guard: creating run %s of %s with every task skipped: duplicate of %s "
                "(HA scheduler race, apache/airflow#54491)",
                run_id,
                dag_id,
                kept,
            )
        self._remember((dag_id, run_id), kept)
        return kept

    def _lookup(
        self, session: Any, precheck: Any, statement: Any, lock_key: tuple[str, ...] | None
    ) -> tuple[str, bool, bool]:
        """Run the precheck, and the statement (built by ``statement()``) only if the precheck found a
        candidate, in a SAVEPOINT of the scheduler's transaction.

        The precheck is a plain indexed lookup that finds nothing for an ordinary run, so an ordinary
        run costs one small query; the statement (comparing consumed events) runs only in a race.
        Returns (kept run_id or "", the run has a note, the run already has task instance rows).

        With ``lock_key``, first take a transaction-scoped advisory lock on it (PostgreSQL only), so
        a second creator of the same key waits here until the first one's transaction ends, and the
        statement (a new snapshot under READ COMMITTED) then sees the first run. The lock is released
        by the scheduler's own commit or rollback.
        """
        self.queries += 1
        connection = session.connection()
        savepoint = connection.begin_nested()
        try:
            locking = lock_key is not None and connection.dialect.name == "postgresql"
            if locking and not self.take_lock(connection, lock_key, session):
                savepoint.commit()
                return _DUPGUARD_NOT_A_DUPLICATE, True, True  # fail open: the sidecar still sees it
            self.statements += 1
            row = connection.execute(precheck).first()
            if row is not None:
                self.statements += 1
                row = connection.execute(statement()).first()
        except BaseException:
            savepoint.rollback()  # the scheduler's transaction stays usable
            raise
        savepoint.commit()  # RELEASE SAVEPOINT: commits nothing
        if row is None:
            return _DUPGUARD_NOT_A_DUPLICATE, True, True
        return str(row[0]), bool(row[1]), bool(row[2])

    def take_lock(self, connection: Any, lock_key: tuple[str, ...], session: Any) -> bool:
        """Take the advisory lock of ``lock_key``; False if this transaction's wait budget ran out.

        The budget is ``lock_wait`` seconds per scheduler transaction, shared by all its runs.

        It polls ``pg_try_advisory_xact_lock`` instead of blocking in PostgreSQL: the scheduler's
        ``lock_timeout`` is never changed, and the guard never sleeps in a lock wait that
        PostgreSQL's deadlock detector could resolve by aborting the scheduler's own statement
        (two creators can hold row locks the other one needs, e.g. asset_partition_dag_run rows).
        """
        from sqlalchemy import func, select

        statement = select(func.pg_try_advisory_xact_lock(_dupguard_lock_id(lock_key)))
        if connection.execute(statement).scalar():
            return True
        self.lock_waits += 1
        transaction = session.get_transaction()
        with self._lock:
            deadline = self._wait_deadlines.get(transaction)
            if deadline is None:
                deadline = self._wait_deadlines[transaction] = time.monotonic() + self.lock_wait
        pause = 0.005
        while time.monotonic() < deadline:
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            if connection.execute(statement).scalar():
                return True
            pause = min(pause * 2, 0.05)
        self.lock_timeouts += 1
        self._log_timeout(lock_key)
        return False

    def created_here(self, key: tuple[str, str]) -> bool:
        """Whether this thread's scheduler transaction is the one that created the duplicate ``key``."""
        session = self.creating_session()
        transaction = None if session is None else session.get_transaction()
        if transaction is None:
            return False
        with self._lock:
            return key in self._created_here.get(transaction, ())

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

    def find_run(
        self, session: Any, dag_id: str, run_id: str
    ) -> tuple[Any, tuple[int, Any, str | None]] | None:
        """The run being created and its (id, run_after, partition_key), from the session's identity map.

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
                    return obj, (int(state["id"]), state["run_after"], state.get("partition_key"))
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

    def run_facts(self, run_pk: int) -> tuple[Any, Any]:
        """Two columns about the run being created: it has a note; it has task instance rows.

        Evaluated only for the row found (a duplicate), so they cost nothing in the common case.
        Task instance rows exist only after the creating transaction (a mapped task expanded later,
        a cleared duplicate run again): the guard then leaves the run and its new task instances alone.
        """
        from airflow.models.dagrun import DagRun, DagRunNote
        from airflow.models.taskinstance import TaskInstance
        from sqlalchemy import and_, select

        note, dr, ti = DagRunNote.__table__, DagRun.__table__.alias("dupguard_self"), TaskInstance.__table__
        return (
            select(note.c.dag_run_id).where(note.c.dag_run_id == run_pk).exists(),
            select(ti.c.run_id)
            .select_from(ti.join(dr, and_(ti.c.dag_id == dr.c.dag_id, ti.c.run_id == dr.c.run_id)))
            .where(dr.c.id == run_pk)
            .exists(),
        )

    def asset_precheck(self, dag_id: str, run_after: Any, run_pk: int, lower_id_only: bool) -> Any:
        """3.0/3.1: is there any other asset run of the DAG created before, with a run_after at or after
        this one? Normally none (runs are created in run_after order): a range scan on
        idx_dag_run_run_after that returns nothing. Only then does asset_statement run."""
        from airflow.models.dagrun import DagRun
        from sqlalchemy import select

        dr = DagRun.__table__
        return (
            select(dr.c.id)
            .where(
                dr.c.dag_id == dag_id,
                dr.c.run_after >= run_after,
                dr.c.run_type == "asset_triggered",
                dr.c.id < run_pk if lower_id_only else dr.c.id != run_pk,
            )
            .limit(1)
        )

    def partitioned_precheck(self, run_pk: int, stale_ids: list[int]) -> Any:
        """3.2: has one of the pending rows this scheduler read been consumed by another run since?
        Normally not (primary-key lookups). Only then does partitioned_statement run."""
        from airflow.models.asset import AssetPartitionDagRun
        from sqlalchemy import select

        apdr = AssetPartitionDagRun.__table__
        return (
            select(apdr.c.id)
            .where(
                apdr.c.id.in_(stale_ids),
                apdr.c.created_dag_run_id.is_not(None),
                apdr.c.created_dag_run_id != run_pk,
            )
            .limit(1)
        )

    def asset_statement(self, dag_id: str, run_after: Any, run_pk: int, lower_id_only: bool = True) -> Any:
        """3.0/3.1: the earliest committed asset run of the DAG that this run duplicates.

        Under the DagModel lock the committed twin always has the lower id. Under the guard's own
        lock (``lower_id_only`` False) the creator that took the lock first may have the higher id
        (its run was flushed a moment later): the committed twin is kept whatever its id, and the
        sidecar's keep rule never keeps a run that carries the guard's note.

        This run is about to consume the events Airflow selects for it (scheduler_job_runner.py
        ``_create_dag_runs_asset_triggered``): events of the DAG's assets (and, from 3.1, of its
        asset aliases) with ``timestamp <= run_after`` and newer than the latest earlier asset run's
        ``run_after``. It is a duplicate of a committed run R when R's ``run_after`` is the same
        (the exact duplicate), or later (the overlap duplicate: this scheduler's queue read was
        older than R's), and R already consumed every one of those events, and there is at least
        one (or the run_after is the same). A run that would consume an event nobody consumed yet
        is never skipped. Normal successive runs have no earlier-created run with a ``run_after``
        at or after theirs, so the range scan on idx_dag_run_run_after finds nothing to check.
        """
        from airflow.models.asset import (
            AssetEvent,
            DagScheduleAssetAliasReference,
            DagScheduleAssetReference,
            asset_alias_asset_event_association_table,
        )
        from airflow.models.asset import association_table as consumed
        from airflow.models.dagrun import DagRun
        from sqlalchemy import and_, exists, func, or_, select

        dr, earlier = DagRun.__table__, DagRun.__table__.alias("dupguard_earlier")
        event, sched = AssetEvent.__table__, DagScheduleAssetReference.__table__
        alias_sched, alias_event = (
            DagScheduleAssetAliasReference.__table__,
            asset_alias_asset_event_association_table,
        )
        window_start = (
            select(func.max(earlier.c.run_after))
            .where(
                earlier.c.dag_id == dag_id,
                earlier.c.run_type == "asset_triggered",
                earlier.c.run_after < run_after,
            )
            .scalar_subquery()
        )
        # The events this run consumes, exactly as the running Airflow selects them: 3.0 reads only
        # scheduled assets, so counting an alias's events there (which no 3.0 run consumes) would let
        # every duplicate of an alias-scheduled DAG through.
        sources = [event.c.asset_id.in_(select(sched.c.asset_id).where(sched.c.dag_id == dag_id))]
        if self.reads_aliases():
            sources.append(
                exists().where(
                    alias_event.c.event_id == event.c.id,
                    alias_event.c.alias_id == alias_sched.c.alias_id,
                    alias_sched.c.dag_id == dag_id,
                )
            )
        its_event = and_(
            event.c.timestamp <= run_after,
            event.c.timestamp > func.coalesce(window_start, _DUPGUARD_DATE_MIN),
            or_(*sources),
        )
        # Explicit correlation: SQLAlchemy's automatic one only reaches the immediately enclosing
        # SELECT, so dag_run would otherwise become a FROM of its own here (any run, not R).
        consumed_by_candidate = (
            exists()
            .where(consumed.c.dag_run_id == dr.c.id, consumed.c.event_id == event.c.id)
            .correlate(dr, event)
        )
        return (
            select(dr.c.run_id, *self.run_facts(run_pk))
            .where(
                dr.c.dag_id == dag_id,
                dr.c.run_after >= run_after,
                dr.c.run_type == "asset_triggered",
                dr.c.id < run_pk if lower_id_only else dr.c.id != run_pk,
                ~exists().where(its_event, ~consumed_by_candidate),
                or_(dr.c.run_after == run_after, exists().where(its_event)),
            )
            .order_by(dr.c.id)
            .limit(1)
        )

    def partitioned_statement(
        self, dag_id: str, partition_key: str, run_pk: int, stale_ids: list[int]
    ) -> Any:
        """3.2: the committed run that consumed one of this session's stale pending partition rows.

        Serialised by the (dag_id, partition_key) lock, so that run was committed first.

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
        # Explicit correlation of the innermost EXISTS (see asset_statement).
        row_event_not_consumed = exists().where(
            pakl.c.asset_partition_dag_run_id == apdr.c.id,
            ~exists()
            .where(consumed.c.dag_run_id == dr.c.id, consumed.c.event_id == pakl.c.asset_event_id)
            .correlate(dr, pakl),
        )
        consumed_event_not_in_row = exists().where(
            consumed.c.dag_run_id == dr.c.id,
            ~exists()
            .where(
                pakl.c.asset_partition_dag_run_id == apdr.c.id, pakl.c.asset_event_id == consumed.c.event_id
            )
            .correlate(apdr, consumed),
        )
        return (
            select(dr.c.run_id, *self.run_facts(run_pk))
            .select_from(apdr.join(dr, and_(dr.c.id == apdr.c.created_dag_run_id)))
            .where(
                apdr.c.id.in_(stale_ids),
                apdr.c.target_dag_id == dag_id,
                apdr.c.partition_key == partition_key,
                dr.c.dag_id == dag_id,
                dr.c.partition_key == partition_key,
                dr.c.run_type == "asset_triggered",
                dr.c.id != run_pk,  # committed first under the lock, whatever its id (asset_statement)
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

    def add_note(self, session: Any, run_pk: int, kept_run_id: str) -> Any:
        """The run note, added to the scheduler's session: written by the scheduler's own flush."""
        from airflow.models.dagrun import DagRunNote

        text = _DUPGUARD_NOTE.format(kept=kept_run_id)[:_DUPGUARD_NOTE_LIMIT]
        note = DagRunNote(content=text)
        note.dag_run_id = run_pk
        session.add(note)
        return note

    def mark_duplicate(
        self, session: Any, run: Any, run_pk: int, kept: str, *, add_note: bool, finish: bool
    ) -> None:
        """Finish the run (``finish``: the creating transaction, no task instance is a row yet), then
        add the note; all or nothing.

        The note is what makes the sidecar report the run "prevented", so it may only stay on a run
        that really was made finished: if finishing (Airflow's own ``set_state``) or adding the note
        raises, the run's state and dates are put back and the note is taken out of the session
        before the error goes on (the guard then fails open: the run goes ahead untouched, with no
        note, and the sidecar judges it like any duplicate).
        """
        saved = {name: run.__dict__.get(name) for name in ("_state", "start_date", "end_date")}
        note = None
        try:
            if finish:
                self.finish_run(run)
            if add_note and not self.note_pending(session, run_pk):
                note = self.add_note(session, run_pk, kept)
        except BaseException:
            for name, value in saved.items():
                setattr(run, name, value)
            if note is not None and note in session:
                session.expunge(note)
            raise

    def finish_run(self, run: Any) -> None:
        """End the duplicate at birth: state ``success`` (its end_date set by Airflow's own setter),
        started at that same moment.

        A run whose tasks are all skipped would otherwise be queued, started and finished by the
        scheduler, and ``DagRun.update_state`` would send the DAG's ``on_success_callback`` for work
        that never happened. A run created finished is never picked up (the scheduler only starts
        queued runs and only updates running ones), so no DAG callback fires for it. Its start_date is
        set too: Airflow's REST API (3.0.6-3.3.2) fails with HTTP 500 on every asset event that a run
        without one consumed (apache/airflow#71360), which would hide the kept run's events from the
        UI and from dupguard's REST source. Written by the scheduler's own flush, like the task
        instances.
        """
        from airflow.utils.state import DagRunState

        run.set_state(DagRunState.SUCCESS)
        if run.start_date is None:
            run.start_date = run.end_date

    def _log_timeout(self, lock_key: tuple[str, ...]) -> None:
        now = time.monotonic()
        with self._lock:
            self._timeouts_unlogged += 1
            if now - self._last_timeout_log < self.error_log_interval:
                return
            count, self._timeouts_unlogged, self._last_timeout_log = self._timeouts_unlogged, 0, now
        _DUPGUARD_LOG.warning(
            "dupguard guard: %d run(s) created unguarded since the last report: another scheduler held "
            "the lock of %s for more than %.1f s (the dupguard sidecar still sees any duplicate)",
            count,
            "/".join(lock_key),
            self.lock_wait,
        )

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


def _dupguard_lock_id(lock_key: tuple[str, ...]) -> int:
    """The advisory lock id (signed 64-bit) of a (dag_id[, partition_key]); collisions only serialise."""
    digest = _dupguard_hashlib.blake2b(
        "\x00".join(("dupguard", *lock_key)).encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


def _dupguard_lock_wait() -> float:
    """Seconds a creator waits for the lock (``DUPGUARD_GUARD_LOCK_WAIT_SECONDS``, default 5, at most
    10). Anything else (not a number, inf, nan, negative, above 10) is refused with one warning and
    the default is used: a bad value must neither stall the scheduler nor switch the lock off."""
    raw = os.environ.get(_DUPGUARD_LOCK_WAIT_ENV)
    if raw is None or not raw.strip():
        return _DUPGUARD_LOCK_WAIT_DEFAULT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if 0.0 <= value <= _DUPGUARD_LOCK_WAIT_MAX:  # False for nan and inf
        return value
    _DUPGUARD_LOG.warning(
        "dupguard guard: %s=%r refused (a number of seconds from 0 to %g: the wait holds the "
        "scheduler's locks); using %g",
        _DUPGUARD_LOCK_WAIT_ENV,
        raw[:40],
        _DUPGUARD_LOCK_WAIT_MAX,
        _DUPGUARD_LOCK_WAIT_DEFAULT,
    )
    return _DUPGUARD_LOCK_WAIT_DEFAULT


def _dupguard_enable_on_creation() -> None:
    """Make Airflow call the hook when it creates task instances, also when loaded as a plugin.

    ``DagRun.verify_integrity`` skips the hook while ``airflow.settings.task_instance_mutation_hook
    .is_noop`` is True, and Airflow clears that flag only after importing an airflow_local_settings
    module (airflow/settings.py ``import_local_settings``), not for ``airflow.policy`` entry points.

    Only where the guard acts (3.0-3.2): a cleared flag makes every DAG's task instances go through
    the hook one by one, which changes Airflow's ``task_instance_created`` counters (docs/how-to/guard.md,
    "Side effect on Airflow's metrics"); on 3.3+ the guard has nothing to do, so it leaves the flag.
    """
    settings = sys.modules.get("airflow.settings")
    dispatcher = getattr(settings, "task_instance_mutation_hook", None)
    if dispatcher is None or not getattr(dispatcher, "is_noop", False):
        return
    if _dupguard_guard.family() is not None:
        dispatcher.is_noop = False


_dupguard_guard = _DupguardGuard()


def _dupguard_task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """dupguard's hook body, for an existing task_instance_mutation_hook to call (see
    docs/how-to/guard.md)."""
    _dupguard_guard.mutate(task_instance)


@_dupguard_hookimpl
def task_instance_mutation_hook(task_instance: Any, dag_run: Any = None) -> None:
    """Airflow cluster policy (``dag_run`` is passed by Airflow 3.3+ only, and not needed)."""
    _dupguard_guard.mutate(task_instance)


_dupguard_enable_on_creation()

"""Asset events that trigger nothing (apache/airflow#56050, every Airflow 3): ``detector.checks.stranded_events.rule``
has the rule, ``statements.stranded_event_candidates`` the one-snapshot read.

A stranded event is a state that lasts until another event of the DAG's assets arrives, so the check
reads it every ``stranded_poll_interval`` (60 s); each (DAG, stranding run) is alerted once (its key).
Events committed after the run whose window held them (``detector.checks.stranded_events.rule_late``,
``statements.stranded_late_candidates``) are the same kind with the reason ``committed_late``: lost for
good, never repaired (the repair step acts on ``StrandedSet`` only).
Its repair step (``repair.py``, ``DUPGUARD_REPAIR_STRANDED``, dry-run by default) puts back
the missing queue row so Airflow's scheduler makes the run. Without SELECT on the queue tables (not in the
grant of older setups) the check logs ``stranded_events_skipped`` naming them and finds nothing: a
refused statement would abort the transaction ``scan`` and ``doctor`` share with their other reads.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.engine import Connection

from detector import logs
from detector.checks.base import CheckBase, RepairContext
from detector.checks.stranded_events import copies, rule_pauses, statements
from detector.checks.stranded_events.repair import StrandedRepairer
from detector.checks.stranded_events.rule import KIND, find_stranded, observe
from detector.checks.stranded_events.rule_late import find_late, observe_late
from detector.config import Config
from detector.core.checks import CheckContext, Observation
from detector.metadb import catalog
from detector.metadb.engine import AirflowDb
from detector.metadb.schema import Family
from detector.metrics import Metrics

log = logs.get("dupguard.checks")


class StrandedEventsCheck(CheckBase):
    kind = KIND

    def __init__(self, config: Config, metrics: Metrics) -> None:
        super().__init__(config, metrics)
        self.repairer = StrandedRepairer(config.repair_stranded, config.stranded_repair_deadline, metrics)

    def repair(self, found: list[Observation], rc: RepairContext) -> None:
        self.repairer.repair(found, rc)

    def applies(self, db: AirflowDb) -> bool:
        return db.tables.asset_queue is not None  # Airflow 3

    def interval(self) -> timedelta:
        return self.config.stranded_poll_interval

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        t = db.tables
        names = [tbl.name for tbl in (t.asset_queue, t.schedule_refs, t.alias_events, t.dag) if tbl is not None]
        held = catalog.table_privileges(conn, [(name, "SELECT") for name in names])
        if not all(held):
            lacking = [name for name, ok in zip(names, held, strict=True) if not ok]
            log.warning("stranded_events_skipped", reason=f"needs GRANT SELECT ON {', '.join(lacking)}")
            return []
        candidates = statements.stranded_event_candidates(conn, db.tables, ctx.since)
        if candidates:
            candidates = rule_pauses.with_pauses(candidates, self._pause_log(conn, db, {c.dag_id for c in candidates}))
        stranded = find_stranded(candidates, dag_filter=ctx.dag_filter)
        # A trigger's copy of a consumed message is marked: its repair would run the consumer again.
        if stranded:
            window, id_paths = self.config.suspect_window, self.config.message_id_paths
            stranded = copies.of_stranded(conn, t, stranded, window, id_paths)
        found = [observe(s, ctx.db_now) for s in stranded]
        late = statements.stranded_late_candidates(conn, db.tables, ctx.since)
        return found + [observe_late(s, ctx.db_now) for s in find_late(late, dag_filter=ctx.dag_filter)]

    def _pause_log(self, conn: Connection, db: AirflowDb, dag_ids: set[str]) -> rule_pauses.PauseLog:
        """The pause records (``rule_pauses``); without SELECT on ``log`` nothing is known: warnings, no error page."""
        name = statements.LOG.name
        if name not in catalog.existing_tables(conn, [name]):  # a cut-down schema (the demo database)
            log.warning("stranded_events_pause_log_unread", reason="no log table")
            return rule_pauses.PauseLog((), None, readable=False)
        if not all(catalog.table_privileges(conn, [(name, "SELECT")])):
            log.warning("stranded_events_pause_log_unread", reason="needs GRANT SELECT ON log")
            return rule_pauses.PauseLog((), None, readable=False)
        direction = db.info.family != Family.AIRFLOW_3_0  # 3.0.x's patch_dag rows do not say which way
        return statements.pause_log(conn, db.tables, dag_ids, patch_direction=direction)


CHECK = StrandedEventsCheck  # what detector.checks.enabled registers for this kind

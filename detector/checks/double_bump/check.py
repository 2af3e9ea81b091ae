"""Task attempts bumped twice (apache/airflow#57618, Airflow 3.0/3.1): ``rule`` (beside it) has the rule.

Live (``dupguard run``) the check remembers, between its runs, the TIs that were scheduled, queued or running (id ->
try, state, host, queuer): read through the ``ti_state`` index Airflow ships, so a run costs what the in-flight set
costs, not what task_instance holds (10M-100M rows in large deployments, benchmarks/results/measurements.md). Only
the in-flight TIs at try >= 2 are looked up in ``task_instance_history`` (its unique key), and only those with a
missing try cost the job and archive-table reads. ``scan`` has no memory: it reads every TI at try >= 2 once (a
sequential scan: there is no index on try_number; benchmarks/results/measurements.md) and reports what it finds as
``suspected``. Alert only: nothing is ever remediated.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.engine import Connection

from detector.checks.base import CheckBase
from detector.checks.double_bump import statements
from detector.checks.double_bump.rule import (
    KIND,
    ORPHAN_WINDOW,
    Evidence,
    OrphanTiming,
    TiRow,
    find_double_bumps,
    observe,
)
from detector.checks.double_bump.statements import bump_tables
from detector.config import Config
from detector.core.checks import CheckContext, Observation
from detector.metadb import catalog
from detector.metadb.engine import AirflowDb, connect
from detector.metadb.schema import Family
from detector.metrics import Metrics


class DoubleBumpCheck(CheckBase):
    kind = KIND

    def __init__(self, config: Config, metrics: Metrics) -> None:
        super().__init__(config, metrics)
        self.tables = bump_tables()
        self.memory: dict[str, TiRow] = {}  # the in-flight TIs of the previous live run, by id
        self.timing = OrphanTiming(config.double_bump_health_check_threshold, config.double_bump_orphan_check_interval)

    def applies(self, db: AirflowDb) -> bool:
        """Airflow 3.0/3.1 (fixed in 3.2.0, PR #60330) with the columns it reads: every real 3.x schema has
        them; dupguard's own demo database (a 3.1 schema cut down to what duplicates need) does not."""
        if db.info.family not in (Family.AIRFLOW_3_0, Family.AIRFLOW_3_1):
            return False
        with connect(db.engine) as conn:
            columns = catalog.table_columns(conn, ("task_instance", "task_instance_history"))
        return {"id", "queued_by_job_id"} <= columns.get("task_instance", set()) and bool(
            columns.get("task_instance_history")
        )

    def interval(self) -> timedelta:
        return self.config.double_bump_poll_interval

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        bt = self.tables
        if ctx.live:
            in_flight = statements.in_flight_tis(conn, bt)
            rows = [r for r in in_flight if r.try_number >= 2 and r.dag_version_id is not None]
        else:
            rows = statements.tis_missing_history(conn, bt, ctx.since)
        history = statements.history_tries(conn, bt, [r.key for r in rows]) if rows else {}
        rows = [r for r in rows if len(history.get(r.key, ())) < r.try_number - 1]
        found = []
        if rows:
            earlier = [self.memory[r.id] for r in rows if r.id in self.memory]
            queuers = [r.queued_by_job_id for r in [*rows, *earlier]]
            times = [r.scheduled_dttm for r in rows if r.scheduled_dttm is not None]
            dead_since = min(times) - ORPHAN_WINDOW if len(times) == len(rows) else None
            jobs = statements.scheduler_jobs(conn, bt, [j for j in queuers if j is not None], dead_since)
            evidence = Evidence(history, {j.id: j for j in jobs}, statements.history_purges(conn), self.timing)
            found = find_double_bumps(rows, evidence, self.memory if ctx.live else None, ctx.dag_filter)
        if ctx.live:
            self.memory = {r.id: r for r in in_flight}
        return [observe(b, ctx.db_now) for b in found]


CHECK = DoubleBumpCheck  # what detector.checks.enabled registers for this kind

"""Split partition keys (apache/airflow#71070, Airflow 3.2+): ``detector.checks.split_partition.rule`` has the rule.

A split is a state, not a new row: it cannot be tailed by ``dag_run.id`` like duplicates, and
``asset_partition_dag_run`` has only its primary key, so each run reads the pending rows with a scan
(benchmarks/results/measurements.md gives its cost), every ``split_poll_interval`` (60 s). A split that lasted
``split_grace`` (on the database's clock, which wrote ``created_at``; this host's may be off) is alerted once.
Nothing is ever remediated.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from sqlalchemy.engine import Connection

from detector.actions.alerts.notice import Notice
from detector.checks.base import CheckBase
from detector.checks.split_partition import statements
from detector.checks.split_partition.alert import split_notice
from detector.checks.split_partition.rule import KIND, SplitPartition, find_split_partitions, observe
from detector.core.checks import CheckContext, Observation
from detector.metadb.engine import AirflowDb


class SplitPartitionCheck(CheckBase):
    kind = KIND

    def applies(self, db: AirflowDb) -> bool:
        return db.tables.partition_dag_run is not None  # Airflow 3.2+

    def interval(self) -> timedelta:
        return self.config.split_poll_interval

    def collect(self, conn: Connection, db: AirflowDb, ctx: CheckContext) -> list[Observation]:
        rows = statements.partition_rows_with_pending(conn, db.tables)
        events = statements.partition_row_events(conn, db.tables, [r.id for r in rows]) if rows else {}
        splits = find_split_partitions(
            rows, events, ctx.db_now, grace=self.config.split_grace, dag_filter=ctx.dag_filter
        )
        return [observe(s, ctx.db_now) for s in splits]

    def notice(self, obs: Observation, cluster: str, detected_at: datetime) -> Notice:
        return split_notice(cast(SplitPartition, obs.subject), cluster, detected_at)


CHECK = SplitPartitionCheck  # what detector.checks.enabled registers for this kind

"""The daemon's watch on split partition keys (apache/airflow#71070), on its own slower cadence.

A split is a state, not a new row: it cannot be tailed by ``dag_run.id`` like duplicates, and
``asset_partition_dag_run`` has only its primary key, so each check reads the pending rows with
a scan (docs/benchmarks.md gives its cost). Every ``split_poll_interval`` (60 s) the leader reads
them, and each split that lasted ``split_grace`` is alerted once: the ledger claim ``detected`` on
its stable key, then one claim per alert channel. Nothing is ever remediated.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Protocol

from detector import logs
from detector.actions.alerts.split import SplitNotice, split_notice
from detector.core.detect import ALL_DAGS, DagFilter
from detector.core.ports import Ledger
from detector.core.split import DEFAULT_SPLIT_GRACE, SplitPartition, find_split_partitions
from detector.metadb import queries
from detector.metadb.engine import AirflowDb, connect
from detector.metrics import Metrics

log = logs.get("dupguard.split")


class SplitAlerter(Protocol):
    def notify_split(self, notice: SplitNotice) -> None: ...


class SplitWatch:
    def __init__(
        self,
        db: AirflowDb,
        ledger: Ledger,
        alerter: SplitAlerter,
        metrics: Metrics,
        *,
        cluster: str,
        grace: timedelta = DEFAULT_SPLIT_GRACE,
        dag_filter: DagFilter = ALL_DAGS,
    ) -> None:
        self.db, self.ledger, self.alerter, self.metrics = db, ledger, alerter, metrics
        self.cluster, self.grace, self.dag_filter = cluster, grace, dag_filter

    @property
    def applies(self) -> bool:
        """Only Airflow 3.2+ has asset_partition_dag_run."""
        return self.db.tables.partition_dag_run is not None

    def check(self, now: datetime) -> list[SplitPartition]:
        """Read the splits, alert the new ones; returns every split seen. Raises on database errors.

        The grace period is measured on the database's clock, which wrote ``created_at`` (issue 23 §6:
        a host 10 minutes ahead reported every new split at once); ``now`` only dates the alert."""
        t = self.db.tables
        with connect(self.db.engine) as conn:
            rows = queries.partition_rows_with_pending(conn, t)
            events = queries.partition_row_events(conn, t, [r.id for r in rows]) if rows else {}
            db_now = queries.database_now(conn)
        splits = find_split_partitions(rows, events, db_now, grace=self.grace, dag_filter=self.dag_filter)
        self.metrics.split_partitions_open.set(len(splits))
        for split in splits:
            if self.ledger.claim(split.key, "detected"):
                self.metrics.split_partitions_detected.inc()
                self.alerter.notify_split(split_notice(split, self.cluster, now))
        return splits

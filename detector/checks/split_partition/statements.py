"""What the split_partition check reads: the pending ``asset_partition_dag_run`` rows (3.2+) and the events
logged for them. SQLAlchemy Core over ``detector.metadb.schema``'s tables; read-only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy import (
    Connection,
    String,
    and_,
    column,
    func,
    select,
    tuple_,
    values,
)

from detector.core.model import PartitionRow
from detector.metadb.batches import chunks
from detector.metadb.partitions import partition_columns, partition_row
from detector.metadb.schema import AirflowTables


def partition_rows_with_pending(conn: Connection, t: AirflowTables) -> list[PartitionRow]:
    """Every pending APDR row, and the newest row of each (DAG, key) that has one.

    APDR has only its primary key (docs/explanation/airflow-internals.md, "Asset tables"): the pending rows are one
    sequential scan; when a row is pending, the newest id of its key a second pass over the rows from the oldest
    pending one on; the newest rows then by primary key. benchmarks/results/measurements.md gives the cost.
    """
    a = t.partition_dag_run
    if a is None:
        return []
    pending = [
        partition_row(r) for r in conn.execute(select(*partition_columns(t)).where(a.c.created_dag_run_id.is_(None)))
    ]
    if not pending:
        return []
    # The newest id of each pending key: a hash join of the rows from the oldest pending one on
    # (rows below it cannot be newer) with the pending keys as a VALUES list. A tuple IN list was
    # evaluated row by row (4x slower at 1M rows); a range join on id walked the primary key.
    pending_keys = sorted({(r.dag_id, r.partition_key) for r in pending})
    newest_query = (
        select(func.max(a.c.id))
        .where(a.c.id >= min(r.id for r in pending))
        .group_by(a.c.target_dag_id, a.c.partition_key)
    )
    if conn.dialect.name == "sqlite":  # no column names on a VALUES list there; a dev database is small
        newest_query = newest_query.where(tuple_(a.c.target_dag_id, a.c.partition_key).in_(pending_keys))
    else:
        keys = values(column("dag_id", String), column("partition_key", String), name="pending_keys").data(pending_keys)
        newest_query = newest_query.join(
            keys, and_(a.c.target_dag_id == keys.c.dag_id, a.c.partition_key == keys.c.partition_key)
        )
    newest_ids = list(conn.execute(newest_query).scalars())
    missing = sorted(set(newest_ids) - {r.id for r in pending})
    rows = list(pending)
    for part in chunks(missing):
        rows.extend(partition_row(r) for r in conn.execute(select(*partition_columns(t)).where(a.c.id.in_(part))))
    return sorted(rows, key=lambda r: r.id)


def partition_row_events(conn: Connection, t: AirflowTables, row_ids: Iterable[int]) -> dict[int, frozenset[int]]:
    """APDR row id -> ids of the asset events logged for it (3.3.2: idx_pakl_apdr_id; 3.2.2: a scan)."""
    log = t.partition_key_log
    if log is None:
        return {}
    found: dict[int, set[int]] = defaultdict(set)
    for part in chunks(sorted(set(row_ids))):
        query = select(log.c.asset_partition_dag_run_id, log.c.asset_event_id).where(
            log.c.asset_partition_dag_run_id.in_(part)
        )
        for row in conn.execute(query):
            found[row.asset_partition_dag_run_id].add(row.asset_event_id)
    return {row_id: frozenset(events) for row_id, events in found.items()}

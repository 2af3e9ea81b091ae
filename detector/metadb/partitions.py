"""Partitioned assets: asset_partition_dag_run (APDR) rows, read by detection and the split-partition check."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Connection,
    Row,
    select,
)

from detector.core.model import PartitionRow
from detector.metadb.batches import chunks
from detector.metadb.schema import AirflowTables

# --- partitioned assets: asset_partition_dag_run (APDR) and its key log (3.2+) ----------------------


def partition_row(row: Row[Any]) -> PartitionRow:
    return PartitionRow(
        id=row.id,
        dag_id=row.target_dag_id,
        partition_key=row.partition_key,
        created_at=row.created_at,
        created_dag_run_id=row.created_dag_run_id,
    )


def partition_columns(t: AirflowTables) -> tuple[Any, ...]:
    a = t.partition_dag_run
    assert a is not None
    return (a.c.id, a.c.target_dag_id, a.c.partition_key, a.c.created_at, a.c.created_dag_run_id)


def partition_rows_for_runs(conn: Connection, t: AirflowTables, run_ids: Iterable[int]) -> dict[int, PartitionRow]:
    """run id -> the APDR row that made it (``created_dag_run_id``; no index: a scan of APDR)."""
    a = t.partition_dag_run
    if a is None:
        return {}
    found: dict[int, PartitionRow] = {}
    for part in chunks(sorted(set(run_ids))):
        for row in conn.execute(select(*partition_columns(t)).where(a.c.created_dag_run_id.in_(part))):
            found[row.created_dag_run_id] = partition_row(row)
    return found

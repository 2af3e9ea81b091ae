"""The Airflow tables dupguard reads, declared explicitly (SQLAlchemy Core) per schema family.

Only the columns dupguard needs are declared; Airflow owns the tables. Column sets per version come
from docs/explanation/airflow-internals.md, "The metadata schema" and the committed ``airflow db migrate`` fixtures.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect


class Family(enum.StrEnum):
    """Schema families: versions whose tables dupguard reads the same way."""

    AIRFLOW_2 = "2.x"
    AIRFLOW_3_0 = "3.0"
    AIRFLOW_3_1 = "3.1"
    AIRFLOW_3_2 = "3.2"
    AIRFLOW_3_3 = "3.3"

    @property
    def has_partitions(self) -> bool:
        return self in (Family.AIRFLOW_3_2, Family.AIRFLOW_3_3)


class UtcDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes from PostgreSQL ``timestamptz`` and SQLite's naive text alike."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        # Airflow stores naive UTC text in SQLite; comparisons there are textual.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        parsed: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


@dataclass(frozen=True)
class AirflowTables:
    family: Family
    metadata: MetaData
    dag_run: Table
    task_instance: Table
    run_events: Table  # dagrun_asset_event
    asset_event: Table
    asset: Table
    job: Table
    alembic_version: Table
    dag_run_note: Table  # written only by the db remediation backend
    # 3.2+ partitioned assets (None before): asset_partition_dag_run and partitioned_asset_key_log.
    partition_dag_run: Table | None = None
    partition_key_log: Table | None = None
    # Airflow 3 (None on 2.x): the asset queue and what the stranded-events check reads beside it.
    asset_queue: Table | None = None  # asset_dag_run_queue
    schedule_refs: Table | None = None  # dag_schedule_asset_reference
    alias_events: Table | None = None  # asset_alias_asset_event
    dag: Table | None = None


def alembic_version_table(metadata: MetaData | None = None) -> Table:
    return Table("alembic_version", metadata or MetaData(), Column("version_num", String(32), primary_key=True))


def airflow_tables(family: Family) -> AirflowTables:
    """Declared tables for ``family``. Airflow 2 is never read: it cannot produce these duplicates."""
    md = MetaData()
    partition_cols = [Column("partition_key", String(250))] if family.has_partitions else []
    # 3.2+: when the run row was inserted (NULL on rows made before 3.2.0); a clear leaves it alone.
    created_cols = [Column("created_at", UtcDateTime)] if family.has_partitions else []
    dag_run = Table(
        "dag_run",
        md,
        Column("id", Integer, primary_key=True),
        Column("dag_id", String(250), nullable=False),
        Column("run_id", String(250), nullable=False),
        Column("run_type", String(50), nullable=False),
        Column("run_after", UtcDateTime, nullable=False),
        Column("state", String(50)),
        Column("queued_at", UtcDateTime),
        Column("start_date", UtcDateTime),
        Column("end_date", UtcDateTime),
        Column("creating_job_id", Integer),
        Column("clear_number", Integer, nullable=False, default=0),
        Column("updated_at", UtcDateTime),
        *partition_cols,
        *created_cols,
    )
    task_instance = Table(
        "task_instance",
        md,
        Column("dag_id", String(250), primary_key=True),
        Column("task_id", String(250), primary_key=True),
        Column("run_id", String(250), primary_key=True),
        Column("map_index", Integer, primary_key=True, default=-1),
        Column("state", String(20)),
        Column("start_date", UtcDateTime),
        Column("end_date", UtcDateTime),
        Column("try_number", Integer),
        Column("duration", Float),
        Column("pid", Integer),
        Column("last_heartbeat_at", UtcDateTime),  # 3.x; read only when remediating (never on Airflow 2)
        Column("updated_at", UtcDateTime),
    )
    run_events = Table(
        "dagrun_asset_event",
        md,
        Column("dag_run_id", Integer, primary_key=True),
        Column("event_id", Integer, primary_key=True),
    )
    asset_event = Table(
        "asset_event",
        md,
        Column("id", Integer, primary_key=True),
        Column("asset_id", Integer, nullable=False),
        Column("source_dag_id", String(250)),
        Column("source_run_id", String(250)),
        Column("timestamp", UtcDateTime, nullable=False),
        # {"from_trigger": true, "payload": ...} on a trigger's event (docs/explanation/airflow-internals.md, "One
        # message, one asset event per triggerer"): read only for events no task wrote (the trigger_event rule)
        Column("extra", JSON),
        *[Column("partition_key", String(250))] if family.has_partitions else [],
    )
    asset = Table(
        "asset",
        md,
        Column("id", Integer, primary_key=True),
        Column("name", String(1500), nullable=False),
        Column("uri", String(1500), nullable=False),
    )
    job = job_table(md)
    # 3.x: user_id is the auth manager's user id as text (2.x: an int FK to ab_user; never written there).
    dag_run_note = Table(
        "dag_run_note",
        md,
        Column("dag_run_id", Integer, primary_key=True),
        Column("user_id", String(128)),
        Column("content", String(1000)),
        Column("created_at", UtcDateTime, nullable=False),
        Column("updated_at", UtcDateTime, nullable=False),
    )
    partition_dag_run = partition_key_log = None
    if family.has_partitions:
        # Only PK(id) on asset_partition_dag_run; 3.3.2 adds idx_pakl_apdr_id on the log
        # (docs/explanation/airflow-internals.md, "Asset tables").
        partition_dag_run = Table(
            "asset_partition_dag_run",
            md,
            Column("id", Integer, primary_key=True),
            Column("target_dag_id", String(250), nullable=False),
            Column("created_dag_run_id", Integer),
            Column("partition_key", String(250), nullable=False),
            Column("created_at", UtcDateTime, nullable=False),
        )
        partition_key_log = Table(
            "partitioned_asset_key_log",
            md,
            Column("id", Integer, primary_key=True),
            Column("asset_id", Integer, nullable=False),
            Column("asset_event_id", Integer, nullable=False),
            Column("asset_partition_dag_run_id", Integer, nullable=False),
        )
    queue_tables = _asset_queue_tables(md, family) if family is not Family.AIRFLOW_2 else {}
    return AirflowTables(
        family=family,
        metadata=md,
        dag_run=dag_run,
        task_instance=task_instance,
        run_events=run_events,
        asset_event=asset_event,
        asset=asset,
        job=job,
        alembic_version=alembic_version_table(md),
        dag_run_note=dag_run_note,
        partition_dag_run=partition_dag_run,
        partition_key_log=partition_key_log,
        **queue_tables,
    )


def job_table(md: MetaData) -> Table:
    """Airflow's ``job`` table (schedulers, triggerers, ...), one declaration for every reader: the poll's
    creating job, doctor's alive-scheduler count, the double_bump and trigger_flapping checks' jobs. Every
    reader names its columns, so declaring them all changes no statement."""
    return Table(
        "job",
        md,
        Column("id", Integer, primary_key=True),
        Column("job_type", String(30)),
        Column("hostname", String(500)),
        Column("state", String(20)),
        Column("start_date", UtcDateTime),
        Column("end_date", UtcDateTime),
        Column("latest_heartbeat", UtcDateTime),
    )


def schedule_refs(md: MetaData) -> Table:
    """``dag_schedule_asset_reference``: which DAGs an asset schedules (the stranded check's consumers,
    the trigger_flapping check's fed DAGs), one declaration for both table sets' metadata."""
    return Table(
        "dag_schedule_asset_reference",
        md,
        Column("asset_id", Integer, primary_key=True),
        Column("dag_id", String(250), primary_key=True),
        Column("created_at", UtcDateTime, nullable=False),
    )


def _asset_queue_tables(md: MetaData, family: Family) -> dict[str, Table]:
    """Same columns in 3.0.6-3.3.2 (docs/explanation/airflow-internals.md, "Asset tables"); PKs as Airflow declares
    them."""
    return {
        "asset_queue": Table(
            "asset_dag_run_queue",
            md,
            Column("asset_id", Integer, primary_key=True),
            Column("target_dag_id", String(250), primary_key=True),
            Column("created_at", UtcDateTime, nullable=False),
        ),
        "schedule_refs": schedule_refs(md),
        "alias_events": Table(
            "asset_alias_asset_event",
            md,
            Column("alias_id", Integer, primary_key=True),
            Column("event_id", Integer, primary_key=True),
        ),
        "dag": Table(
            "dag",
            md,
            Column("dag_id", String(250), primary_key=True),
            Column("is_paused", Boolean),
            Column("is_stale", Boolean),  # removed from the DAG files: Airflow makes no run for it
            Column("asset_expression", JSON),  # the serialized asset condition (the stranded repair reads it)
            *([Column("timetable_partitioned", Boolean)] if family.has_partitions else []),
        ),
    }

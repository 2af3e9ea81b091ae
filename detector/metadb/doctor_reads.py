"""``dupguard doctor``'s reads (detector/app/doctor.py): read once, nothing written."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    column,
    func,
    literal,
    select,
    table,
    union,
)

from detector.core.model import GUARD_NOTE_PREFIX
from detector.metadb.schema import AirflowTables, UtcDateTime

# --- dupguard doctor (detector/app/doctor.py): read once, nothing written ----------------------------

# Each DAG-count query reads Airflow tables the detection does not (and the documented grant does not
# name): ``dag``, the schedule references and the watcher links. Their names per version, from the
# committed ``airflow db migrate`` fixtures: 2.x says dataset, 3.x asset; watchers are asset_trigger
# in 3.0/3.1 and asset_watcher from 3.2; dag.timetable_partitioned exists from 3.2.
SCHEDULE_TABLES = ("dag_schedule_asset_reference", "dag_schedule_dataset_reference")
ALIAS_TABLES = ("dag_schedule_asset_alias_reference", "dag_schedule_dataset_alias_reference")
WATCHER_TABLES = ("asset_watcher", "asset_trigger")


def can_create_schema(conn: Connection, schema: str) -> bool:
    """Whether ``dupguard init-db`` (or ``DUPGUARD_LEDGER=on``) can make ``schema`` and its tables:
    CREATE on the database, or, when an admin created the schema beforehand, USAGE and CREATE on it."""
    if conn.dialect.name != "postgresql":
        return False
    if conn.execute(select(func.to_regnamespace(literal(schema)))).scalar() is not None:
        on_schema = [func.has_schema_privilege(literal(schema), literal(p)) for p in ("USAGE", "CREATE")]
        return all(conn.execute(select(*on_schema)).one())
    check = func.has_database_privilege(func.current_database(), literal("CREATE"))
    return bool(conn.execute(select(check)).scalar())


def can_use_schema(conn: Connection, schema: str) -> bool:
    """USAGE on ``schema`` (``has_schema_privilege``): what the ledger needs once the schema exists."""
    return bool(conn.execute(select(func.has_schema_privilege(literal(schema), literal("USAGE")))).scalar())


_job_heartbeat = table("job", column("job_type"), column("state"), column("latest_heartbeat", UtcDateTime))


def schedulers_alive(conn: Connection, since: datetime) -> int:
    """Scheduler jobs in state running whose heartbeat is newer than ``since`` (Airflow's own health
    check: ``[scheduler] scheduler_health_check_threshold``; index job_type_heart)."""
    job = _job_heartbeat
    query = select(func.count()).where(
        job.c.job_type == "SchedulerJob", job.c.state == "running", job.c.latest_heartbeat > since
    )
    return int(conn.execute(query).scalar_one())


def triggerers_alive(conn: Connection, since: datetime) -> int:
    """Triggerer jobs in state running whose heartbeat is newer than ``since`` (``[triggerer]
    triggerer_health_check_threshold``, 30 s by default; index job_type_heart)."""
    job = _job_heartbeat
    query = select(func.count()).where(
        job.c.job_type == "TriggererJob", job.c.state == "running", job.c.latest_heartbeat > since
    )
    return int(conn.execute(query).scalar_one())


def _refs(name: str) -> Any:
    key = "alias_id" if "alias" in name else ("dataset_id" if "dataset" in name else "asset_id")
    return table(name, column("dag_id"), column(key)), key


def _live_dags(dag_columns: set[str]) -> tuple[Any, list[Any]]:
    """The ``dag`` table and the filter for DAGs that can get runs: not paused, not stale (2.x: active)."""
    dag = table("dag", *[column(c) for c in ("dag_id", "is_paused", "is_stale", "is_active", "timetable_partitioned")])
    where = [dag.c.is_paused.is_(False)]
    where.append(dag.c.is_stale.is_(False) if "is_stale" in dag_columns else dag.c.is_active.is_(True))
    return dag, where


def scheduled_dag_count(conn: Connection, dag_columns: set[str], refs: Sequence[str]) -> int:
    """Live DAGs scheduled on an asset or an asset alias (any of the ``refs`` tables)."""
    dag, where = _live_dags(dag_columns)
    ids = union(*[select(_refs(name)[0].c.dag_id) for name in refs]).subquery()
    return int(conn.execute(select(func.count()).where(*where, dag.c.dag_id.in_(select(ids.c.dag_id)))).scalar_one())


def partitioned_dag_counts(conn: Connection, dag_columns: set[str], ref: str) -> tuple[int, int]:
    """(live partitioned DAGs, those scheduled on 2+ assets): 3.2+, ``dag.timetable_partitioned``."""
    dag, where = _live_dags(dag_columns)
    refs, key = _refs(ref)
    per_dag = select(refs.c.dag_id, func.count(refs.c[key]).label("n")).group_by(refs.c.dag_id).subquery()
    query = (
        select(func.count(), func.count().filter(per_dag.c.n >= 2))
        .select_from(dag.outerjoin(per_dag, per_dag.c.dag_id == dag.c.dag_id))
        .where(*where, dag.c.timetable_partitioned.is_(True))
    )
    row = conn.execute(query).one()
    return int(row[0]), int(row[1])


def watcher_fed_dag_count(conn: Connection, dag_columns: set[str], ref: str, watchers: str) -> int:
    """Live DAGs scheduled on an asset that has a watcher (an event-driven trigger feeding it)."""
    dag, where = _live_dags(dag_columns)
    refs, _ = _refs(ref)
    links = table(watchers, column("asset_id"))
    fed = select(refs.c.dag_id).join(links, links.c.asset_id == refs.c.asset_id)
    return int(conn.execute(select(func.count()).where(*where, dag.c.dag_id.in_(fed))).scalar_one())


def guard_notes_since(conn: Connection, t: AirflowTables, since: datetime) -> int:
    """Runs the in-scheduler guard stopped since ``since`` (its note, GUARD_NOTE_PREFIX)."""
    note = t.dag_run_note
    query = select(func.count()).where(
        note.c.content.startswith(GUARD_NOTE_PREFIX, autoescape=True), note.c.created_at >= since
    )
    return int(conn.execute(query).scalar_one())

"""What the trigger_flapping check reads (docs/explanation/airflow-internals.md, "Triggers claimed by every
triggerer"): its tables per schema family (``TriggerTables``: only this check reads them this way) and the triggers,
their owners and the triggerer jobs.
SQLAlchemy Core; read-only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    Row,
    Select,
    String,
    Table,
    Uuid,
    select,
)

from detector.checks.trigger_flapping.rule import ASSET, CALLBACK, TriggererJob, TriggerRow
from detector.metadb.batches import chunks
from detector.metadb.schema import (
    Family,
    UtcDateTime,
    job_table,
    schedule_refs,
)


@dataclass(frozen=True)
class TriggerTables:
    """What the trigger_flapping check reads (docs/explanation/airflow-internals.md, "Triggers claimed by every
    triggerer"): the ``trigger`` rows, the asset link (``asset_trigger`` in 3.0/3.1, ``asset_watcher`` from 3.2), the
    consumer references, the deadline-callback link (3.1: ``deadline.trigger_id``; 3.2+: ``callback.trigger_id`` and
    ``deadline.callback_id``) and the triggerer ``job`` rows."""

    trigger: Table
    asset_link: Table
    asset: Table
    consumer_ref: Table
    job: Table
    dag_run: Table
    deadline: Table | None  # None on 3.0: no callback triggers
    callback: Table | None  # 3.2+


def trigger_tables(family: Family) -> TriggerTables:
    md = MetaData()
    deadline = callback = None
    if family in (Family.AIRFLOW_3_2, Family.AIRFLOW_3_3):
        callback = Table("callback", md, Column("id", Uuid), Column("trigger_id", Integer))
        deadline = Table("deadline", md, Column("callback_id", Uuid), Column("dagrun_id", Integer))
    elif family is Family.AIRFLOW_3_1:
        deadline = Table("deadline", md, Column("trigger_id", Integer), Column("dagrun_id", Integer))
    link = "asset_trigger" if family in (Family.AIRFLOW_3_0, Family.AIRFLOW_3_1) else "asset_watcher"
    return TriggerTables(
        trigger=Table(
            "trigger",
            md,
            Column("id", Integer, primary_key=True),
            Column("created_date", UtcDateTime, nullable=False),
            Column("triggerer_id", Integer),
        ),
        asset_link=Table(link, md, Column("asset_id", Integer), Column("trigger_id", Integer)),
        asset=Table("asset", md, Column("id", Integer, primary_key=True), Column("name", String(1500))),
        consumer_ref=schedule_refs(md),
        job=job_table(md),
        dag_run=Table("dag_run", md, Column("id", Integer, primary_key=True), Column("dag_id", String(250))),
        deadline=deadline,
        callback=callback,
    )


def flapping_candidates(conn: Connection, tt: TriggerTables) -> list[TriggerRow]:
    """Asset (AssetWatcher) and deadline-callback triggers, with their assets and the DAGs they feed.

    Asset triggers: ``asset_trigger``/``asset_watcher`` (index on trigger_id) -> ``asset`` (PK) ->
    ``dag_schedule_asset_reference`` (PK asset_id, dag_id). Callback triggers: 3.1 ``deadline.trigger_id``,
    3.2+ ``callback.trigger_id`` -> ``deadline.callback_id`` (index) -> ``dag_run`` (PK). Small tables:
    a row per trigger, not per event.
    """
    tr, link, ref = tt.trigger, tt.asset_link, tt.consumer_ref
    found: dict[int, tuple[Row[Any], str, set[str], set[str], set[int]]] = {}
    assets = (
        select(
            tr.c.id,
            tr.c.created_date,
            tr.c.triggerer_id,
            tt.asset.c.id.label("asset_id"),
            tt.asset.c.name,
            ref.c.dag_id,
        )
        .select_from(
            tr.join(link, link.c.trigger_id == tr.c.id)
            .join(tt.asset, tt.asset.c.id == link.c.asset_id)
            .outerjoin(ref, ref.c.asset_id == link.c.asset_id)
        )
        .order_by(tr.c.id)
    )
    for row in conn.execute(assets):
        entry = found.setdefault(row.id, (row, ASSET, set(), set(), set()))
        entry[2].add(row.name)
        entry[4].add(row.asset_id)
        if row.dag_id is not None:
            entry[3].add(row.dag_id)
    if tt.deadline is not None:
        dl, run = tt.deadline, tt.dag_run
        if tt.callback is not None:
            cb = tt.callback
            joined = (
                tr.join(cb, cb.c.trigger_id == tr.c.id)
                .outerjoin(dl, dl.c.callback_id == cb.c.id)
                .outerjoin(run, run.c.id == dl.c.dagrun_id)
            )
        else:
            joined = tr.join(dl, dl.c.trigger_id == tr.c.id).outerjoin(run, run.c.id == dl.c.dagrun_id)
        callbacks = select(tr.c.id, tr.c.created_date, tr.c.triggerer_id, run.c.dag_id).select_from(joined)
        for row in conn.execute(callbacks.order_by(tr.c.id)):
            entry = found.setdefault(row.id, (row, CALLBACK, set(), set(), set()))
            if row.dag_id is not None:
                entry[3].add(row.dag_id)
    return [
        TriggerRow(
            id=row.id,
            created_date=row.created_date,
            triggerer_id=row.triggerer_id,
            kind=kind,
            assets=tuple(sorted(names)),
            dag_ids=tuple(sorted(dag_ids)),
            asset_ids=tuple(sorted(asset_ids)),
        )
        for row, kind, names, dag_ids, asset_ids in found.values()
    ]


def _triggerer_job(row: Row[Any]) -> TriggererJob:
    return TriggererJob(
        id=row.id,
        hostname=row.hostname,
        state=row.state,
        start_date=row.start_date,
        end_date=row.end_date,
        latest_heartbeat=row.latest_heartbeat,
    )


def _triggerer_job_select(tt: TriggerTables) -> Select[Any]:
    job = tt.job
    columns = (job.c.id, job.c.hostname, job.c.state, job.c.start_date, job.c.end_date, job.c.latest_heartbeat)
    return select(*columns).where(job.c.job_type == "TriggererJob").order_by(job.c.id)


def triggerer_jobs_by_id(conn: Connection, tt: TriggerTables, ids: Iterable[int]) -> list[TriggererJob]:
    """The triggerer jobs among ``ids`` (job PK): the owners a live look compares."""
    out: list[TriggererJob] = []
    for part in chunks(sorted(set(ids))):
        out += [_triggerer_job(r) for r in conn.execute(_triggerer_job_select(tt).where(tt.job.c.id.in_(part)))]
    return out


def triggerer_jobs_since(conn: Connection, tt: TriggerTables, since: datetime | None) -> list[TriggererJob]:
    """Triggerer jobs that heartbeat after ``since`` (all when None): index job_type_heart."""
    query = _triggerer_job_select(tt)
    if since is not None:
        query = query.where(tt.job.c.latest_heartbeat >= since)
    return [_triggerer_job(r) for r in conn.execute(query)]

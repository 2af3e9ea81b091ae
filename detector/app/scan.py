"""The one-shot history audit behind ``dupguard scan``: candidate keys by SQL, verdicts by the core."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from detector.checks.base import Check
from detector.checks.runner import observe
from detector.core.checks import CheckContext, Observation
from detector.core.decisions import decisions_from_notes
from detector.core.detect import ALL_DAGS, DEFAULT_SUSPECT_WINDOW, DagFilter, find_duplicates
from detector.core.model import Finding
from detector.core.reprocess import needs_origins, refine_partitioned
from detector.core.trigger_event import IdPaths, find_trigger_event_duplicates
from detector.metadb import batches, catalog, consumption, dag_runs, partitions
from detector.metadb.engine import AirflowDb, ServerRole, connect, server_role
from detector.metadb.versions import SchemaInfo
from detector.sources.database import copies

Progress = Callable[[int, int], None]  # (done, total) in runs examined


@dataclass(frozen=True)
class ScanReport:
    info: SchemaInfo
    findings: list[Finding]
    scanned_at: datetime
    since: datetime | None
    runs_examined: int
    note: str | None = None  # why nothing was examined (Airflow 2), shown in every format
    observations: dict[str, list[Observation]] = field(default_factory=dict)  # by check kind (detector.checks)
    check_errors: dict[str, str] = field(default_factory=dict)  # kind -> why that check has no answer
    source: str = "database"  # or "api" (--source api: no dag_run ids, creating jobs or partition rows)
    server: ServerRole | None = None  # the PostgreSQL server read: primary or standby (None: SQLite, the API)


def scan(
    db: AirflowDb,
    *,
    now: datetime,
    since: timedelta | None = None,
    dag_filter: DagFilter = ALL_DAGS,
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
    message_id_paths: IdPaths = (),
    progress: Progress | None = None,
    checks: Sequence[Check] = (),
) -> ScanReport:
    """Every duplicate group whose runs have run_after within ``since`` of ``now`` (all history if None).

    The database narrows history to keys shared by more than one run (GROUP BY on the run_after
    index) and to runs of one DAG sharing a consumed event; only those runs' events and task
    instances are read. Then each of ``checks`` looks once (``live`` False), on the same connection;
    one that fails is named in ``check_errors`` and the rest of the report stands.
    """
    t = db.tables
    with connect(db.engine) as conn:
        server = server_role(conn)
        # ``since`` and the split grace are ages of Airflow's timestamps: on the clock that wrote them
        # (this host's may be off); ``now`` (this host's) dates the report.
        db_now = catalog.database_now(conn)
        start = None if since is None else db_now - since
        asset_keys = [k for k in dag_runs.candidate_asset_keys(conn, t, start) if dag_filter.selects(k[0])]
        part_keys = [k for k in dag_runs.candidate_partition_keys(conn, t, start) if dag_filter.selects(k[0])]
        found = dag_runs.runs_for_asset_keys(conn, t, asset_keys)
        found += dag_runs.runs_sharing_events(conn, t, start)  # the overlap race: other run_after
        found += dag_runs.runs_for_partition_keys(conn, t, part_keys, start)
        # the trigger_event kind
        found_copies, consumers = copies.since(conn, t, start, suspect_window, message_id_paths)
        found += consumers
        runs = list({r.id: r for r in found if dag_filter.selects(r.dag_id)}.values())
        ids = [r.id for r in runs]
        events: dict[int, frozenset[int]] = {}
        task_progress = {}
        notes: dict[int, str] = {}
        for done, part in enumerate(batches.chunks(ids), start=1):
            events.update(consumption.consumed_events(conn, t, part))
            part_progress, part_notes = consumption.progress_and_notes(conn, t, part, now)
            task_progress.update(part_progress)
            notes.update(part_notes)  # a run dupguard stopped is never the kept one
            if progress is not None:
                progress(min(done * batches.CHUNK, len(ids)), len(ids))
        prior = decisions_from_notes(runs, notes, task_progress)  # a run dupguard stopped is never kept
        findings = find_duplicates(
            runs, events, task_progress, dag_filter=dag_filter, suspect_window=suspect_window, prior=prior
        )
        suspects = [r.id for f in findings if needs_origins(f) for r in f.runs]
        if suspects:
            origins = partitions.partition_rows_for_runs(conn, t, suspects)
            findings = refine_partitioned(findings, origins, events, task_progress, suspect_window=suspect_window)
        if found_copies:
            findings += find_trigger_event_duplicates(
                runs, events, found_copies, task_progress, dag_filter=dag_filter, prior=prior, beside=findings
            )
            findings.sort(key=lambda f: (f.dag_id, f.run_after, f.key))
        ctx = CheckContext(db_now=db_now, now=now, dag_filter=dag_filter, live=False, since=start)
        observations, check_errors = observe(checks, conn, db, ctx)
    return ScanReport(
        info=db.info,
        findings=findings,
        scanned_at=now,
        since=start,
        runs_examined=len(ids),
        observations=observations,
        check_errors=check_errors,
        server=server,
    )

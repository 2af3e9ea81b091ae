"""``dupguard demo``: a realistic incident in an embedded SQLite database, run through the real code.

The database has the Airflow 3.1 tables dupguard reads (declared in ``detector.metadb.schema``) and is
seeded with the incident from the user's report (apache/airflow#63507): duplicate pairs with
microsecond-equal run_after, a race that duplicated every consumer of one asset, and look-alikes
that must not be flagged (fan-out, successive runs, manual and scheduled runs, an AND-condition
"premature" run, a cleared run). No Airflow, no network.
"""

from __future__ import annotations

import random
import shlex
import shutil
import string
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, insert
from sqlalchemy.exc import SQLAlchemyError

from detector.app.scan import ScanReport, scan
from detector.core.model import GUARD_NOTE_PREFIX
from detector.errors import ConfigError
from detector.metadb.engine import open_airflow_db
from detector.metadb.schema import Family, airflow_tables

REVISION_3_1_2 = "cc92b33c6709"
INCIDENT_START = datetime(2026, 3, 12, 11, 30, 0, 0, tzinfo=UTC)
CLOCK = INCIDENT_START + timedelta(hours=1)  # the demo's "now": its report is the same on every machine
T = airflow_tables(Family.AIRFLOW_3_1)
# SQLite's application_id (header offset 68, https://www.sqlite.org/fileformat.html#application_id):
# the mark that a file is a demo database dupguard wrote, the only kind ``build`` replaces.
APPLICATION_ID = 0x64706764  # "dpgd"
_SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class _Seeder:
    conn: Connection
    rng: random.Random
    next_run: int = 1
    next_event: int = 1
    run_ids: dict[str, int] = field(default_factory=dict)

    def suffix(self) -> str:
        return "".join(self.rng.choices(string.ascii_letters + string.digits, k=8))

    def event(self, asset_id: int, at: datetime, source_dag: str = "producer_asset_trigger") -> int:
        eid = self.next_event
        self.next_event += 1
        self.conn.execute(
            insert(T.asset_event).values(
                id=eid, asset_id=asset_id, timestamp=at, source_dag_id=source_dag, source_run_id=f"run_{eid}"
            )
        )
        return eid

    def run(
        self,
        dag_id: str,
        run_after: datetime,
        *,
        events: list[int],
        job: int = 101,
        run_type: str = "asset_triggered",
        tasks: Mapping[str, tuple[str | None, float]] | None = None,
        suffix: str | None = None,
        delay_ms: int = 0,
        clear_number: int = 0,
    ) -> str:
        rid = self.next_run
        self.next_run += 1
        run_id = (
            f"{run_type}__{run_after.isoformat()}_{suffix or self.suffix()}"
            if run_type == "asset_triggered"
            else f"{run_type}__{run_after.isoformat()}"
        )
        queued = run_after + timedelta(milliseconds=120 + delay_ms)
        tasks = tasks if tasks is not None else {"extract": ("success", 4.0), "load": ("success", 11.5)}
        # As Airflow finishes a run: success once every task succeeded or was skipped (so the guard's
        # duplicate, every task skipped, is listed finished, as the guard leaves it: docs/how-to/guard.md).
        state = "success" if all(s in ("success", "skipped") for s, _ in tasks.values()) else "running"
        self.conn.execute(
            insert(T.dag_run).values(
                id=rid,
                dag_id=dag_id,
                run_id=run_id,
                run_type=run_type,
                run_after=run_after,
                state=state,
                queued_at=queued,
                creating_job_id=job,
                clear_number=clear_number,
            )
        )
        for event_id in events:
            self.conn.execute(insert(T.run_events).values(dag_run_id=rid, event_id=event_id))
        started = queued + timedelta(milliseconds=300)
        for task_id, (ti_state, seconds) in tasks.items():
            ran = ti_state not in (None, "skipped", "scheduled", "queued")
            self.conn.execute(
                insert(T.task_instance).values(
                    dag_id=dag_id,
                    task_id=task_id,
                    run_id=run_id,
                    map_index=-1,
                    state=ti_state,
                    try_number=1,
                    start_date=started if ran else None,
                    end_date=started + timedelta(seconds=seconds) if ran and ti_state != "running" else None,
                )
            )
            started += timedelta(seconds=seconds)
        self.run_ids[run_id] = rid
        return run_id


def seed(engine: Engine, *, seed_value: int = 63507) -> None:
    """Create the tables and write the incident."""
    T.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(insert(T.alembic_version).values(version_num=REVISION_3_1_2))
        conn.execute(
            insert(T.job),
            [
                {"id": job, "job_type": "SchedulerJob", "hostname": f"airflow-scheduler-7d9f-{i}"}
                # the incident's two schedulers, stopped since: Airflow marks a job that ended cleanly so
                | {"state": "success", "latest_heartbeat": INCIDENT_START + timedelta(hours=1)}
                for i, job in enumerate((101, 102))
            ],
        )
        conn.execute(
            insert(T.asset),
            [
                {
                    "id": 1,
                    "name": "test://reproduction-asset-duplicate-runs",
                    "uri": "test://reproduction-asset-duplicate-runs",
                },
                {"id": 2, "name": "s3://warehouse/orders", "uri": "s3://warehouse/orders"},
                {"id": 3, "name": "s3://warehouse/customers", "uri": "s3://warehouse/customers"},
            ],
        )
        s = _Seeder(conn, random.Random(seed_value))
        _seed_report_incident(s)
        _seed_fanout_race(s)
        _seed_lookalikes(s)


def _seed_report_incident(s: _Seeder) -> None:
    """The consumer of the user's report: one event every ~30 s, two of them doubled by the race."""
    at = INCIDENT_START
    doubled = {
        10: ("vBRUPZHu", "IOcGWY58", "too late: both ran"),
        28: ("R3JlEANp", "CSaWJHzX", "caught in time"),
    }
    for i in range(36):
        at += timedelta(seconds=30, microseconds=s.rng.randrange(1_000_000))
        eid = s.event(1, at)
        run_after = at + timedelta(milliseconds=40)
        if i not in doubled:
            s.run("consumer_asset_listener", run_after, events=[eid], job=101 + i % 2)
            continue
        first, second, story = doubled[i]
        s.run(
            "consumer_asset_listener",
            run_after,
            events=[eid],
            job=101,
            suffix=first,
            tasks={"process_event": ("success", 8.0)},
        )
        late = {"process_event": ("success", 8.0)} if story.startswith("too late") else {"process_event": (None, 0.0)}
        s.run(
            "consumer_asset_listener",
            run_after,
            events=[eid],
            job=102,
            suffix=second,
            tasks=late,
            delay_ms=61,
        )


def _seed_fanout_race(s: _Seeder) -> None:
    """One orders event, three consumers: a single race doubles every one of them."""
    at = INCIDENT_START + timedelta(minutes=7, seconds=3, microseconds=412_907)
    eid = s.event(2, at, source_dag="ingest_orders")
    for dag_id in ("load_orders", "refresh_dashboard", "notify_finance"):
        s.run(dag_id, at, events=[eid], job=102, tasks={"extract": ("running", 0.0), "load": (None, 0.0)})
        s.run(
            dag_id,
            at,
            events=[eid],
            job=101,
            tasks={"extract": ("queued", 0.0), "load": (None, 0.0)},
            delay_ms=58,
        )
    # A fourth consumer whose duplicate the in-scheduler guard created with every task skipped (and
    # its note, by which dupguard recognises it).
    kept = s.run("archive_orders", at, events=[eid], job=102, tasks={"archive": ("running", 0.0)})
    guarded = s.run("archive_orders", at, events=[eid], job=101, tasks={"archive": ("skipped", 0.0)}, delay_ms=60)
    s.conn.execute(
        insert(T.dag_run_note).values(
            dag_run_id=s.run_ids[guarded],
            content=f"{GUARD_NOTE_PREFIX}{kept} (HA scheduler race, apache/airflow#54491)",
            created_at=at,
            updated_at=at,
        )
    )


def _seed_lookalikes(s: _Seeder) -> None:
    """Runs that resemble duplicates but are not."""
    base = INCIDENT_START + timedelta(minutes=12)
    # Fan-out: one customers event, one run for each of three consumers.
    eid = s.event(3, base, source_dag="ingest_customers")
    for dag_id in ("load_customers", "crm_sync", "churn_model"):
        s.run(dag_id, base + timedelta(milliseconds=35), events=[eid])
    # Manual and scheduled runs of an asset-scheduled DAG at the same moment as an asset run.
    s.run("load_orders", base, events=[], run_type="manual")
    s.run("load_orders", base, events=[], run_type="scheduled")
    # AND condition: a premature run from a stale snapshot has a later run_after and disjoint events.
    e_orders, e_customers = s.event(2, base + timedelta(seconds=1)), s.event(3, base + timedelta(seconds=2))
    s.run("join_orders_customers", base + timedelta(seconds=2), events=[e_orders, e_customers], job=101)
    e_orders_2 = s.event(2, base + timedelta(seconds=5))
    s.run("join_orders_customers", base + timedelta(seconds=5), events=[e_orders_2], job=102)
    # A run cleared and re-run: same row, clear_number 1.
    e_late = s.event(1, base + timedelta(seconds=9))
    s.run("consumer_asset_listener", base + timedelta(seconds=9), events=[e_late], clear_number=1)


def is_demo_db(path: Path) -> bool:
    """True if ``path`` is a SQLite file an earlier ``build`` wrote (read from its header, not opened)."""
    try:
        with path.open("rb") as f:
            header = f.read(72)
    except OSError:
        return False
    return header[:16] == _SQLITE_MAGIC and int.from_bytes(header[68:72], "big") == APPLICATION_ID


def build(path: Path) -> Engine:
    """A fresh demo database at ``path``. Replaces only a file an earlier demo wrote: a user's own file
    (say a real ``airflow.db``) is never deleted. ConfigError for a folder or a missing folder."""
    if path.is_dir():
        raise ConfigError([f"--db {path}: is a folder; name a file, e.g. {path / 'airflow.db'}"])
    if not path.parent.is_dir():
        raise ConfigError([f"--db {path}: the folder {path.parent} does not exist"])
    if path.exists() or path.is_symlink():
        if not is_demo_db(path):
            raise ConfigError([f"--db {path}: refusing to replace a file that `dupguard demo` did not write"])
        path.unlink()
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"PRAGMA application_id = {APPLICATION_ID}")
        seed(engine)
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", exc)).splitlines()[0]
        raise ConfigError([f"--db {path}: cannot write the demo database ({detail})"]) from None
    return engine


def incident_report(path: Path) -> ScanReport:
    """A fresh demo database at ``path`` (``build``), scanned at the demo's clock."""
    engine = build(path)
    try:
        return scan(open_airflow_db(engine), now=CLOCK)
    finally:
        engine.dispose()


def command(argv0: str | None = None) -> str:
    """How to type this ``dupguard`` in the hint after the demo: ``dupguard`` when that name on PATH is
    this program, else the path it was started by (``make demo`` runs ``.venv/bin/dupguard``, which
    is not on PATH unless the venv is activated)."""
    me = Path(sys.argv[0] if argv0 is None else argv0)
    found = shutil.which("dupguard")
    if me.name != "dupguard":  # python -m detector
        return "dupguard" if found else f"{shlex.quote(sys.executable)} -m detector"
    if found and Path(found).resolve() == me.resolve():
        return "dupguard"
    return shlex.quote(str(me))

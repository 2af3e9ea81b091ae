"""Partitioned-asset scenarios produced by Airflow's own code (3.2+).

Run this with the python of an Airflow virtualenv (``.airflow-venvs/<ver>/bin/python``).
For one scenario it:

1. creates a fresh database ``af_part_<ver with _>_<scenario>`` and runs ``airflow db migrate``
   on it (AIRFLOW_HOME is a temp dir, no examples);
2. writes the scenario's DAG file into a temp dags folder and serializes it with Airflow's own
   ``DagBundlesManager.sync_bundles_to_db`` + ``BundleDagBag`` + ``sync_bag_to_db`` (what
   ``airflow dags reserialize`` does). DAGs are created unpaused
   (``[core] dags_are_paused_at_creation = False``);
3. produces asset events the way a finishing producer task does: a producer run carrying the
   partition_key is created with ``SerializedDAG.create_dagrun`` and its task instance is passed to
   ``AssetManager.register_asset_change(task_instance=ti, asset=..., partition_key=..., session=...)``,
   which writes ``asset_event``, ``asset_partition_dag_run`` (APDR) and ``partitioned_asset_key_log``.
   Consumers use ``PartitionedAssetTimetable(assets=..., default_partition_mapper=...)``. The producer
   has ``schedule=None`` on 3.2; 3.3 only lets partitioned Dags take a partition_key, so there it is
   ``PartitionedAtRuntime()``;
4. creates consumer runs only through ``SchedulerJobRunner._create_dagruns_for_dags`` inside
   ``prohibit_commit`` (the first step of ``_do_scheduling``), each runner with its own ``Job`` row;
5. records the ground truth from Airflow's ORM objects (``DagRun``, ``consumed_asset_events``,
   ``AssetPartitionDagRun``), checks the expected outcome, and writes ``<scenario>.json`` and a
   data-only ``pg_dump`` ``<scenario>.sql``.

Nothing here INSERTs into dag_run by hand.

How the race interleaving works (``race_partitioned``)
-----------------------------------------------------
Two ``SchedulerJobRunner`` objects (jobs ``scheduler-a`` and ``scheduler-b``) run
``_create_dagruns_for_dags`` in two threads, each with its own session (own DB connection and
transaction). ``_create_dagruns_for_partitioned_asset_dags`` starts with
``session.scalars(select(AssetPartitionDagRun).where(created_dag_run_id IS NULL) ...)``. We wrap
``scalars`` on each thread's *session object* (not Airflow's code): once that APDR query has
returned (psycopg2 buffers the whole result on execute, so the read is complete), the thread waits
on a ``threading.Barrier(2)``. Thus both schedulers have read the pending APDR before either creates
a run. Airflow's logic is unchanged; only the timing is forced.

* 3.2.x: the SELECT takes no lock, so both see the pending APDR, both call ``create_dagrun`` with
  ``run_after = utcnow()`` and both ``UPDATE apdr SET created_dag_run_id``; the second UPDATE
  waits for the first commit and then overwrites it. Result: two runs with the same
  (dag_id, partition_key) and identical consumed events; the APDR points at the later committer.
* 3.3.x: the SELECT is ``FOR UPDATE OF apdr SKIP LOCKED``; the scheduler that selects second gets
  no row (it still reaches the barrier), so only one run is created.

Other scenarios (look-alikes, 3.2.2): ``partition_fanout`` (two events fanned out to three consumer
DAGs with identity / hour / day mappers: one run per (dag, key), the daily one consumes both),
``partition_successive`` (different keys over time, alternating schedulers, one run each) and
``partition_rerun`` (the same key gets a new event after its run was created: a second run with
different consumed events -- recorded as a *suspected* group, not a confirmed one).

Usage::

    .airflow-venvs/3.2.2/bin/python scripts/airflow/scenarios_partitioned.py \\
        --scenario race_partitioned --out-dir tests/fixtures/scenarios/3.2.2 \\
        --pg-url postgresql://postgres@127.0.0.1:55432/postgres
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ASSET_NAME = "hourly_sales"
PRODUCER = "produce_hourly_sales"
CONSUMER = "consume_hourly_sales"  # IdentityMapper (the default)
ROLLUP_HOUR = "report_sales_by_hour"  # StartOfHourMapper
ROLLUP_DAY = "rollup_daily_sales"  # StartOfDayMapper

# Two producer assets feeding one partitioned consumer (apache/airflow#71070), and an ordinary
# (non-partitioned) asset consumer for the ADRQ race.
SALES_EU, SALES_US = "sales_eu", "sales_us"
PRODUCE_EU, PRODUCE_US = "produce_sales_eu", "produce_sales_us"
CONSUME_AND = "consume_sales_eu_and_us"  # (sales_eu & sales_us), IdentityMapper
CONSUME_OR = "consume_sales_eu_or_us"  # (sales_eu | sales_us), IdentityMapper
ORDERS, PRODUCE_ORDERS, CONSUME_ORDERS = "orders", "produce_orders", "consume_orders"


def _split_dags(consumer: str, condition: str) -> str:
    return textwrap.dedent(
        f"""\
        sales_eu = Asset(name={SALES_EU!r})
        sales_us = Asset(name={SALES_US!r})
        with DAG({PRODUCE_EU!r}, schedule=producer_schedule, catchup=False):
            Noop(task_id='write', outlets=[sales_eu])
        with DAG({PRODUCE_US!r}, schedule=producer_schedule, catchup=False):
            Noop(task_id='write', outlets=[sales_us])
        with DAG(
            {consumer!r},
            schedule=PartitionedAssetTimetable(assets={condition}, default_partition_mapper=IdentityMapper()),
            catchup=False,
        ):
            Noop(task_id='extract') >> Noop(task_id='load')
        """
    )


EXTRA_DAGS = {
    CONSUME_AND: _split_dags(CONSUME_AND, "sales_eu & sales_us"),
    CONSUME_OR: _split_dags(CONSUME_OR, "sales_eu | sales_us"),
    CONSUME_ORDERS: textwrap.dedent(
        f"""\
        orders = Asset(name={ORDERS!r})
        with DAG({PRODUCE_ORDERS!r}, schedule=None, catchup=False):
            Noop(task_id='write', outlets=[orders])
        with DAG({CONSUME_ORDERS!r}, schedule=[orders], catchup=False):
            Noop(task_id='extract') >> Noop(task_id='load')
        """
    ),
}

SCENARIOS = {
    "race_partitioned": "Two schedulers (HA) both read the same pending asset_partition_dag_run "
    "before either creates a run.",
    "partition_fanout": "Two partitioned events fanned out to three consumer Dags with different "
    "partition mappers; one run per (dag_id, partition_key).",
    "partition_successive": "Events for different partition keys over time, each handled by "
    "alternating schedulers; one run per key.",
    "partition_rerun": "The same partition key receives a new event after its run was created; "
    "a second run with different consumed events: a legitimate re-processing (each run has its own "
    "asset_partition_dag_run row, the second created after the first run).",
    "race_asset": "Two schedulers (HA): scheduler-b held after its unlocked asset_dag_run_queue read while "
    "scheduler-a creates and commits the run (the 3.0/3.1 race; 3.2+ re-reads the queue with a lock).",
    "split_and": "Two producer assets emit the same partition key at the same time; the consumer waits "
    "for both (AND): two pending asset_partition_dag_run rows, the consumer never runs "
    "(apache/airflow#71070).",
    "split_or": "Two producer assets emit the same partition key at the same time; the consumer takes "
    "either (OR): two pending asset_partition_dag_run rows, each creates its own run of the one key "
    "(apache/airflow#71070).",
}

# Excluded from the dump: alembic_version is in the schema fixture; log/import_error are bulky
# and nothing references them.
EXCLUDED_TABLE_DATA = ("alembic_version", "log", "import_error")


def dag_file_source(consumers: list[str]) -> str:
    """Source of the scenario's DAG file: one producer and the requested consumers."""
    mappers = {
        CONSUMER: "IdentityMapper()",
        ROLLUP_HOUR: "StartOfHourMapper()",
        ROLLUP_DAY: "StartOfDayMapper()",
    }
    lines = [
        "from airflow.sdk import DAG, Asset, BaseOperator, PartitionedAssetTimetable",
        "from airflow.sdk import IdentityMapper, StartOfDayMapper, StartOfHourMapper  # noqa: F401",
        "",
        "",
        "class Noop(BaseOperator):",
        "    def execute(self, context):",
        "        return None",
        "",
        "",
        "try:  # 3.3+: only partitioned Dags accept a partition_key when triggered",
        "    from airflow.sdk import PartitionedAtRuntime",
        "",
        "    producer_schedule = PartitionedAtRuntime()",
        "except ImportError:  # 3.2: any Dag run may carry a partition_key",
        "    producer_schedule = None",
        "",
        f"sales = Asset(name={ASSET_NAME!r})",
        "",
        f"with DAG({PRODUCER!r}, schedule=producer_schedule, catchup=False):",
        "    Noop(task_id='write', outlets=[sales])",
    ]
    for dag_id in consumers:
        if dag_id in EXTRA_DAGS:
            lines += ["", *EXTRA_DAGS[dag_id].splitlines()]
            continue
        lines += [
            "",
            "with DAG(",
            f"    {dag_id!r},",
            "    schedule=PartitionedAssetTimetable(",
            f"        assets=sales, default_partition_mapper={mappers[dag_id]}",
            "    ),",
            "    catchup=False,",
            "):",
            "    Noop(task_id='extract') >> Noop(task_id='load')",
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Database preparation (before Airflow is imported: its config is read from the environment)
# --------------------------------------------------------------------------------------------


def pg_bin(name: str) -> str:
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    found = shutil.which(name)
    if not found:
        sys.exit(f"{name} not found")
    return found


def with_db(url: str, db: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + db, parts.query, parts.fragment))


def prepare_database(admin_url: str, db: str, home: Path, consumers: list[str]) -> str:
    psql = pg_bin("psql")
    subprocess.run(
        [
            psql,
            "-v",
            "ON_ERROR_STOP=1",
            "-q",
            admin_url,
            "-c",
            f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)',
            "-c",
            f'CREATE DATABASE "{db}"',
        ],
        check=True,
    )
    db_url = with_db(admin_url, db)
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "partitioned_sales.py").write_text(dag_file_source(consumers))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url.replace("postgresql://", "postgresql+psycopg2://", 1),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": os.environ.get("SCENARIO_LOG_LEVEL", "WARNING"),
        }
    )
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, stdout=subprocess.DEVNULL)
    return db_url


def dump_database(db_url: str, out: Path) -> None:
    cmd = [
        pg_bin("pg_dump"),
        "--data-only",
        "--inserts",
        "--column-inserts",
        "--disable-triggers",
        "--no-owner",
        "--no-privileges",
    ]
    for table in EXCLUDED_TABLE_DATA:
        cmd.append(f"--exclude-table-data=public.{table}")
    cmd.append(db_url)
    dump = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    # pg_dump >= 15.14 adds psql-only `\restrict <random key>` lines: drop them (as the schema
    # fixtures do) so the file also loads through a driver and regenerations diff cleanly.
    lines = [line for line in dump.splitlines() if not line.startswith(("\\restrict ", "\\unrestrict "))]
    out.write_text("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------------
# Airflow-side helpers (import airflow lazily, after the environment is set)
# --------------------------------------------------------------------------------------------


def serialize_dags() -> None:
    """Parse the dags folder and write DagModel/SerializedDagModel rows, like `dags reserialize`."""
    import inspect

    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import BundleDagBag, sync_bag_to_db
    from airflow.utils.session import create_session

    with create_session() as session:
        manager = DagBundlesManager()
        manager.sync_bundles_to_db(session=session)
        session.commit()
        for bundle in manager.get_all_dag_bundles():
            bundle.initialize()
            bag = BundleDagBag(bundle.path, bundle_path=bundle.path, bundle_name=bundle.name)
            if bag.import_errors:
                sys.exit(f"DAG import errors: {bag.import_errors}")
            kwargs = {}
            if "version_data" in inspect.signature(sync_bag_to_db).parameters:  # 3.3+
                kwargs["version_data"] = None
            sync_bag_to_db(bag, bundle.name, bundle_version=bundle.get_current_version(), session=session, **kwargs)


def check_unpaused(dag_ids: list[str]) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = dict(session.execute(select(DagModel.dag_id, DagModel.is_paused)).all())
    missing = [d for d in dag_ids if d not in rows]
    paused = [d for d in dag_ids if rows.get(d)]
    if missing or paused:
        sys.exit(f"DAGs missing={missing} paused={paused}")


def new_scheduler(hostname: str):
    """A SchedulerJobRunner with its own persisted Job row (hostname identifies the 'pod')."""
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.utils.session import create_session

    job = Job()
    runner = SchedulerJobRunner(job=job)
    job.hostname = hostname
    with create_session() as session:
        job.prepare_for_execution(session=session)
    return runner


def produce_event(
    partition_key: str | None,
    *,
    producer: str = PRODUCER,
    asset_name: str = ASSET_NAME,
    before_commit=None,
) -> int:
    """Run the producer for `partition_key` and register its asset change like a finished task.

    `before_commit` (if given) is called after the change is registered and flushed, before the
    transaction commits: two producers finishing at the same moment.
    """
    from airflow._shared.timezones import timezone
    from airflow.assets.manager import AssetManager
    from airflow.models.asset import AssetModel
    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from airflow.utils.types import DagRunTriggeredByType, DagRunType
    from sqlalchemy import select

    with create_session() as session:
        dag = SerializedDagModel.get(producer, session=session).dag
        now = timezone.utcnow()
        dr = dag.create_dagrun(
            run_id=DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=None, run_after=now),
            logical_date=None,
            data_interval=None,
            run_after=now,
            run_type=DagRunType.MANUAL,
            triggered_by=DagRunTriggeredByType.REST_API,
            state=DagRunState.RUNNING,
            partition_key=partition_key,
            session=session,
        )
        ti = dr.get_task_instance("write", session=session)
        ti.set_state(TaskInstanceState.SUCCESS, session=session)
        asset = session.scalar(select(AssetModel).where(AssetModel.name == asset_name))
        event = AssetManager.register_asset_change(
            task_instance=ti,
            asset=asset,
            partition_key=partition_key,
            extra={"rows": len(partition_key or "")},
            session=session,
        )
        dr.set_state(DagRunState.SUCCESS)
        session.flush()
        event_id = event.id
        if before_commit is not None:
            before_commit()
        return event_id


def scheduler_loop(runner, *, after_apdr_read=None) -> float:
    """Step 1 of SchedulerJobRunner._do_scheduling: create dag runs, then commit.

    `after_apdr_read` (if given) is called once, right after this scheduler's pending-APDR SELECT
    returned, with the ids of the APDR rows it read. Returns the monotonic time of the commit.
    """
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    with create_session() as session:
        if after_apdr_read is not None:
            original = session.scalars
            fired = []

            def scalars(statement, *args, **kwargs):
                sql = str(statement)
                if fired or "FROM asset_partition_dag_run" not in sql or "created_dag_run_id IS NULL" not in sql:
                    return original(statement, *args, **kwargs)
                fired.append(True)
                # Equivalent to session.scalars(statement), but buffered so the ids read are visible.
                frozen = session.execute(statement, *args, **kwargs).freeze()
                after_apdr_read([apdr.id for apdr in frozen().scalars()])
                return frozen().scalars()

            session.scalars = scalars  # instance attribute: only this session is affected
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard, session)
            guard.commit()
        return time.monotonic()


def race(runner_a, runner_b) -> tuple[dict[int, float], dict[int, list[int]]]:
    """Both schedulers read the pending APDRs, then both continue.

    Returns ({job_id: commit time}, {job_id: ids of the pending APDRs it read}).
    """
    barrier = threading.Barrier(2, timeout=60)
    commits: dict[int, float] = {}
    reads: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def work(runner):
        def after_read(apdr_ids):
            reads[runner.job.id] = apdr_ids
            barrier.wait()

        try:
            commits[runner.job.id] = scheduler_loop(runner, after_apdr_read=after_read)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(r,)) for r in (runner_a, runner_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return commits, reads


# --------------------------------------------------------------------------------------------
# Ground truth
# --------------------------------------------------------------------------------------------


def consumer_runs() -> list[dict]:
    """All asset-triggered runs, read through Airflow's ORM, in creation (id) order."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunType
    from sqlalchemy import select

    with create_session() as session:
        runs = session.scalars(
            select(DagRun).where(DagRun.run_type == DagRunType.ASSET_TRIGGERED).order_by(DagRun.id)
        ).all()
        return [
            {
                "id": r.id,
                "dag_id": r.dag_id,
                "run_id": r.run_id,
                "partition_key": r.partition_key,
                "run_after": r.run_after,
                "creating_job_id": r.creating_job_id,
                "event_ids": sorted(e.id for e in r.consumed_asset_events),
            }
            for r in runs
        ]


def apdr_pointers() -> dict[int, int | None]:
    from airflow.models.asset import AssetPartitionDagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return dict(session.execute(select(AssetPartitionDagRun.id, AssetPartitionDagRun.created_dag_run_id)).all())


def apdr_rows() -> list[dict]:
    """Every asset_partition_dag_run row with the events its partitioned_asset_key_log rows hold."""
    from airflow.models.asset import AssetPartitionDagRun, PartitionedAssetKeyLog
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events: dict[int, list[int]] = {}
        for apdr_id, event_id in session.execute(
            select(PartitionedAssetKeyLog.asset_partition_dag_run_id, PartitionedAssetKeyLog.asset_event_id)
        ):
            events.setdefault(apdr_id, []).append(event_id)
        return [
            {
                "id": a.id,
                "target_dag_id": a.target_dag_id,
                "partition_key": a.partition_key,
                "created_at": a.created_at.isoformat(),
                "created_dag_run_id": a.created_dag_run_id,
                "event_ids": sorted(events.get(a.id, [])),
            }
            for a in session.scalars(select(AssetPartitionDagRun).order_by(AssetPartitionDagRun.id))
        ]


def produce_together(key: str, sources: list[tuple[str, str]]) -> list[int]:
    """Producers of different assets finish at the same moment for one partition key.

    Each registers its asset change in its own transaction (``register_asset_change`` ->
    ``_get_or_create_apdr``, which locks the *producer's* asset row); both wait on a barrier
    after their flush and before their commit, so each one's "latest pending row" SELECT ran
    before the other committed. Returns the event ids in ``sources`` order.
    """
    barrier = threading.Barrier(len(sources), timeout=60)
    ids: dict[int, int] = {}
    errors: list[BaseException] = []

    def work(i: int, producer: str, asset: str) -> None:
        try:
            ids[i] = produce_event(key, producer=producer, asset_name=asset, before_commit=barrier.wait)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i, p, a)) for i, (p, a) in enumerate(sources)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return [ids[i] for i in range(len(sources))]


def group_by_key(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dag_id"], r["partition_key"]), []).append(r)
    return groups


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise SystemExit(f"scenario check failed: {msg}")


# --------------------------------------------------------------------------------------------
# Scenarios. Each returns (expected_groups, suspected_groups, notes).
# --------------------------------------------------------------------------------------------


def scenario_race_partitioned(version: tuple[int, ...]):
    a, b = new_scheduler("scheduler-a"), new_scheduler("scheduler-b")
    # A normal, undisturbed run first, so the fixture also holds a run that is not a duplicate.
    produce_event("2026-11-30T04:00:00")
    scheduler_loop(a)
    before = {r["id"] for r in consumer_runs()}
    event_id = produce_event("2026-11-30T05:00:00")
    commits, reads = race(a, b)
    new = [r for r in consumer_runs() if r["id"] not in before]
    pointers = apdr_pointers()
    notes = {
        "race_event_id": event_id,
        "job_ids": {"scheduler-a": a.job.id, "scheduler-b": b.job.id},
        "pending_apdr_ids_read_by_job": {str(k): v for k, v in sorted(reads.items())},
    }
    if version < (3, 3):
        check(len(reads) == 2 and all(len(ids) == 1 for ids in reads.values()), f"both read: {reads}")
        check(len({tuple(ids) for ids in reads.values()}) == 1, "both read the same APDR")
        check(len(new) == 2, f"expected 2 runs from the race, got {len(new)}")
        r1, r2 = sorted(new, key=lambda r: (r["run_after"], r["id"]))
        check(r1["id"] < r2["id"], "the earlier run_after is also the lower id (unambiguous 'first')")
        check(r1["partition_key"] == r2["partition_key"] == "2026-11-30T05:00:00", "partition keys")
        check(r1["event_ids"] == r2["event_ids"] == [event_id], "consumed events")
        check(r1["creating_job_id"] != r2["creating_job_id"], "creating jobs differ")
        later_job = max(commits, key=commits.get)
        later_run = next(r for r in new if r["creating_job_id"] == later_job)
        pointed = [apdr for apdr, run in pointers.items() if run in (r1["id"], r2["id"])]
        check(
            len(pointed) == 1 and pointers[pointed[0]] == later_run["id"],
            "APDR.created_dag_run_id points at the later committer",
        )
        notes.update(
            run_after_gap_seconds=(r2["run_after"] - r1["run_after"]).total_seconds(),
            apdr_created_dag_run_id=later_run["id"],
            later_committer_job_id=later_job,
        )
        expected = [
            {
                "dag_id": r1["dag_id"],
                "kind": "partitioned",
                "confidence": "confirmed",
                "run_ids": [r1["run_id"], r2["run_id"]],
                "first_run_id": r1["run_id"],
                "partition_key": r1["partition_key"],
                "shared_event_ids": r1["event_ids"],
            }
        ]
        return expected, [], notes
    check(sorted(len(ids) for ids in reads.values()) == [0, 1], f"SKIP LOCKED: one reads it: {reads}")
    check(len(new) == 1, f"expected 1 run from the race on {version}, got {len(new)}")
    check(new[0]["event_ids"] == [event_id], "consumed events")
    winner = new[0]["creating_job_id"]
    check(len(reads[winner]) == 1, "the run was created by the scheduler that got the row")
    notes["winner_job_id"] = winner
    return [], [], notes


def scenario_partition_fanout(version: tuple[int, ...]):
    a = new_scheduler("scheduler-a")
    e1 = produce_event("2026-11-30T05:00:00")
    e2 = produce_event("2026-11-30T06:00:00")
    scheduler_loop(a)
    runs = consumer_runs()
    groups = group_by_key(runs)
    check(all(len(g) == 1 for g in groups.values()), "one run per (dag_id, partition_key)")
    expected_keys = {
        (CONSUMER, "2026-11-30T05:00:00"): [e1],
        (CONSUMER, "2026-11-30T06:00:00"): [e2],
        (ROLLUP_HOUR, "2026-11-30T05"): [e1],
        (ROLLUP_HOUR, "2026-11-30T06"): [e2],
        (ROLLUP_DAY, "2026-11-30"): [e1, e2],
    }
    check({k: g[0]["event_ids"] for k, g in groups.items()} == expected_keys, f"fan-out: {groups}")
    return [], [], {"event_ids": [e1, e2]}


def scenario_partition_successive(version: tuple[int, ...]):
    schedulers = [new_scheduler("scheduler-a"), new_scheduler("scheduler-b")]
    events = []
    for i, hour in enumerate(("04", "05", "06")):
        events.append(produce_event(f"2026-11-30T{hour}:00:00"))
        scheduler_loop(schedulers[i % 2])
        time.sleep(0.5)
    runs = consumer_runs()
    check(len(runs) == 3, f"3 runs expected, got {len(runs)}")
    check(len({r["partition_key"] for r in runs}) == 3, "distinct keys")
    check([r["event_ids"] for r in runs] == [[e] for e in events], "one event each")
    return [], [], {"event_ids": events}


def scenario_partition_rerun(version: tuple[int, ...]):
    a, b = new_scheduler("scheduler-a"), new_scheduler("scheduler-b")
    key = "2026-11-30T05:00:00"
    e1 = produce_event(key)
    scheduler_loop(a)
    time.sleep(2.0)  # the producer re-processes the same partition a bit later
    e2 = produce_event(key)
    scheduler_loop(b)
    runs = consumer_runs()
    check(len(runs) == 2, f"2 runs expected, got {len(runs)}")
    r1, r2 = runs
    check(r1["partition_key"] == r2["partition_key"] == key, "same key")
    check(r1["event_ids"] == [e1] and r2["event_ids"] == [e2], "different consumed events")
    suspected = [
        {
            "dag_id": r1["dag_id"],
            "partition_key": key,
            "run_ids": [r1["run_id"], r2["run_id"]],
            "run_after_gap_seconds": round((r2["run_after"] - r1["run_after"]).total_seconds(), 6),
        }
    ]
    return [], suspected, {"event_ids": [e1, e2]}


def scenario_partition_rerun_truth(version: tuple[int, ...]):
    """partition_rerun, with what tells it from a race: the rows' pending periods do not overlap."""
    expected, _, notes = scenario_partition_rerun(version)
    runs = consumer_runs()
    rows = apdr_rows()
    own = {r["created_dag_run_id"]: r for r in rows}
    check(all(r["id"] in own for r in runs), f"each run has its own APDR row: {rows}")
    r1, r2 = runs
    from datetime import datetime

    second_row_created = datetime.fromisoformat(own[r2["id"]]["created_at"])
    check(second_row_created > r1["run_after"], "the second row was created after the first run")
    notes.update(
        apdr=rows,
        legitimate_reprocessing={
            "dag_id": r1["dag_id"],
            "partition_key": r1["partition_key"],
            "run_ids": [r1["run_id"], r2["run_id"]],
            "seconds_between_runs": round((r2["run_after"] - r1["run_after"]).total_seconds(), 6),
        },
    )
    return expected, [], notes


def _split(consumer: str, version: tuple[int, ...]):
    a = new_scheduler("scheduler-a")
    key = "2026-11-30T05:00:00"
    e_eu, e_us = produce_together(key, [(PRODUCE_EU, SALES_EU), (PRODUCE_US, SALES_US)])
    pending_before = [r for r in apdr_rows() if r["created_dag_run_id"] is None]
    scheduler_loop(a)
    scheduler_loop(a)  # a second pass changes nothing: the split rows never merge
    rows = apdr_rows()
    check(len(pending_before) == 2, f"two pending APDR rows for one (dag, key): {pending_before}")
    check(
        sorted(r["event_ids"] for r in pending_before) == sorted([[e_eu], [e_us]]),
        f"one event per row: {pending_before}",
    )
    check(len({(r["target_dag_id"], r["partition_key"]) for r in rows}) == 1, "one (dag, key)")
    return key, (e_eu, e_us), pending_before, rows


def scenario_split_and(version: tuple[int, ...]):
    key, events, _pending, rows = _split(CONSUME_AND, version)
    check(consumer_runs() == [], "the AND consumer never runs")
    check(all(r["created_dag_run_id"] is None for r in rows), "both rows stay pending")
    notes = {"event_ids": list(events), "apdr": rows}
    notes["split_partitions"] = [
        {
            "dag_id": CONSUME_AND,
            "partition_key": key,
            "apdr_ids": [r["id"] for r in rows],
            "event_ids_by_apdr": {str(r["id"]): r["event_ids"] for r in rows},
        }
    ]
    return [], [], notes


def scenario_split_or(version: tuple[int, ...]):
    key, events, pending, rows = _split(CONSUME_OR, version)
    runs = consumer_runs()
    check(len(runs) == 2, f"two runs of one key: {runs}")
    check(all(r["partition_key"] == key for r in runs), "same key")
    check(sorted(r["event_ids"] for r in runs) == sorted([[e] for e in events]), "one event each")
    own = {r["created_dag_run_id"]: r for r in rows}
    check(all(r["id"] in own and own[r["id"]]["event_ids"] == r["event_ids"] for r in runs), "each row -> own run")
    first, second = runs
    expected = [
        {
            "dag_id": CONSUME_OR,
            "kind": "partitioned",
            "confidence": "confirmed",
            "run_ids": [first["run_id"], second["run_id"]],
            "first_run_id": first["run_id"],
            "partition_key": key,
            "shared_event_ids": [],
            "split_apdr_ids": [own[first["id"]]["id"], own[second["id"]]["id"]],
        }
    ]
    return expected, [], {"event_ids": list(events), "apdr": rows, "pending_apdr_before_scheduling": pending}


def scenario_race_asset(version: tuple[int, ...]):
    """The 3.0/3.1 ADRQ race interleaving, run on 3.2+: the locked re-read leaves scheduler-b nothing."""
    from airflow.models.serialized_dag import SerializedDagModel

    a, b = new_scheduler("scheduler-a"), new_scheduler("scheduler-b")
    produce_event(None, producer=PRODUCE_ORDERS, asset_name=ORDERS)
    scheduler_loop(a)  # an ordinary earlier run
    before = {r["id"] for r in consumer_runs()}
    event_id = produce_event(None, producer=PRODUCE_ORDERS, asset_name=ORDERS)
    b_read, a_done = threading.Event(), threading.Event()
    original = SerializedDagModel.get_latest_serialized_dags
    held = {"b": False}

    def hold(*args, **kwargs):
        # dags_needing_dagruns calls this right after its unlocked SELECT of asset_dag_run_queue.
        if threading.current_thread().name == "scheduler-b" and not held["b"]:
            held["b"] = True
            b_read.set()
            a_done.wait(60)
        return original(*args, **kwargs)

    errors: list[BaseException] = []

    def work(runner):
        try:
            scheduler_loop(runner)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            b_read.set()

    SerializedDagModel.get_latest_serialized_dags = staticmethod(hold)
    try:
        tb = threading.Thread(target=work, args=(b,), name="scheduler-b")
        tb.start()
        check(b_read.wait(60), "scheduler-b reached its queue read")
        ta = threading.Thread(target=work, args=(a,), name="scheduler-a")
        ta.start()
        ta.join(60)
        a_done.set()
        tb.join(60)
    finally:
        SerializedDagModel.get_latest_serialized_dags = original
    if errors:
        raise errors[0]
    check(held["b"], "scheduler-b was held after its unlocked queue read")
    new = [r for r in consumer_runs() if r["id"] not in before]
    check(len(new) == 1, f"one run from the race on {version}, got {new}")
    check(new[0]["creating_job_id"] == a.job.id and new[0]["event_ids"] == [event_id], f"scheduler-a's run: {new}")
    return [], [], {"race_event_id": event_id, "job_ids": {"scheduler-a": a.job.id, "scheduler-b": b.job.id}}


SCENARIO_SETUP = {
    "race_partitioned": ([CONSUMER], scenario_race_partitioned),
    "partition_fanout": ([CONSUMER, ROLLUP_HOUR, ROLLUP_DAY], scenario_partition_fanout),
    "partition_successive": ([CONSUMER], scenario_partition_successive),
    "partition_rerun": ([CONSUMER], scenario_partition_rerun_truth),
    "race_asset": ([CONSUME_ORDERS], scenario_race_asset),
    "split_and": ([CONSUME_AND], scenario_split_and),
    "split_or": ([CONSUME_OR], scenario_split_or),
}


EXTRA_PRODUCERS = {
    "race_asset": [PRODUCE_ORDERS],
    "split_and": [PRODUCE_EU, PRODUCE_US],
    "split_or": [PRODUCE_EU, PRODUCE_US],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIO_SETUP))
    parser.add_argument("--out-dir", required=True, type=Path)
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:55432/postgres")
    parser.add_argument("--keep-home", action="store_true", help="keep the temp AIRFLOW_HOME")
    parser.add_argument("--db", help="database to (re)create (default af_part_<ver>_<scenario>)")
    args = parser.parse_args()

    from importlib.metadata import version as dist_version

    ver = dist_version("apache-airflow-core")
    ver_tuple = tuple(int(p) for p in ver.split(".")[:3])
    if ver_tuple < (3, 2):
        sys.exit(f"partitioned assets need Airflow 3.2+, this venv has {ver}")
    consumers, build = SCENARIO_SETUP[args.scenario]
    db = args.db or f"af_part_{ver.replace('.', '_')}_{args.scenario}"
    home = Path(tempfile.mkdtemp(prefix=f"af-part-{ver}-"))
    started = time.monotonic()
    try:
        db_url = prepare_database(args.pg_url, db, home, consumers)
        serialize_dags()
        check_unpaused([PRODUCER, *consumers, *EXTRA_PRODUCERS.get(args.scenario, [])])
        expected, suspected, notes = build(ver_tuple)
        runs = consumer_runs()
        truth = {
            "scenario": args.scenario,
            "airflow_version": ver,
            "description": SCENARIOS[args.scenario],
            "expected_groups": expected,
            "suspected_groups": suspected,
            "all_run_ids": [r["run_id"] for r in runs],
            "runs": [{**r, "run_after": r["run_after"].isoformat()} for r in runs],
            "notes": notes,
            "generated_by": "scripts/airflow/scenarios_partitioned.py",
        }
        args.out_dir.mkdir(parents=True, exist_ok=True)
        dump_database(db_url, args.out_dir / f"{args.scenario}.sql")
        (args.out_dir / f"{args.scenario}.json").write_text(json.dumps(truth, indent=2) + "\n")
        print(
            textwrap.shorten(
                f"{ver} {args.scenario}: {len(runs)} asset runs, {len(expected)} confirmed, "
                f"{len(suspected)} suspected ({time.monotonic() - started:.1f}s)",
                200,
            )
        )
    finally:
        if not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

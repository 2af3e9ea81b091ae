"""Builds scenario fixtures of asset-triggered DAG runs with Airflow's OWN code (3.0.x / 3.1.x).

Why: dupguard must flag the duplicate runs that two HA schedulers create in Airflow 3.0/3.1
(see docs/explanation/airflow-internals.md, "The 3.0/3.1 race") and must NOT flag look-alikes (fan-out, successive runs,
manual/scheduled/backfill runs, cleared runs, AND conditions). Hand-written INSERTs would only
encode our own assumptions, so every row here is written by Airflow itself:

* DAG files are parsed by ``DagBag`` and stored with Airflow's DAG-processing code
  (3.0: ``DagBag.sync_to_db``; 3.1: ``airflow.models.dagbag.sync_bag_to_db``).
* Asset events come from ``AssetManager.register_asset_change`` (asset_event + asset_dag_run_queue),
  attributed to a finished task instance of a manually triggered producer run.
* Runs are created by ``SchedulerJobRunner._create_dagruns_for_dags`` (one call = the run-creation
  step of one scheduler loop), ``trigger_dag`` (manual) and ``_create_backfill`` (backfill).
* The race: two ``SchedulerJobRunner`` objects, each with its own ``Job`` row and session, in two
  threads. Thread B is held on a ``threading.Event`` right after its *unlocked* ADRQ read in
  ``DagModel.dags_needing_dagruns`` (we wrap ``SerializedDagModel.get_latest_serialized_dags``, the
  next thing that function calls; Airflow's logic is unchanged). Thread A creates the runs and
  commits; then B resumes and creates the same runs again from its stale snapshot.

The ground truth (``--out-json``) is recorded from what Airflow did (which runner created which
run, each run's consumed events), never by a duplicate detector.

Run it with an Airflow venv's python, pointed at a fresh DB migrated by that version
(``scripts/airflow/regen_scenarios.sh`` does all of this):

    scripts/airflow/af.sh 3.1.2 postgresql://.../db python scripts/airflow/scenarios_asset.py \
        --scenario race_asset --out-json tests/fixtures/scenarios/3.1.2/race_asset.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# Airflow must read these before it is imported. Callers (af.sh) set the DB and AIRFLOW_HOME.
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
os.environ.setdefault("AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING", "True")
os.environ.setdefault("AIRFLOW__CORE__EXECUTOR", "LocalExecutor")

ORDERS = 'Asset(name="orders", uri="s3://warehouse/orders")'
CUSTOMERS = 'Asset(name="customers", uri="s3://warehouse/customers")'

DAG_HEADER = """\
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset

START = datetime(2026, 1, 1)
"""


def producer_dag(dag_id: str, asset_expr: str) -> str:
    return f"""
with DAG("{dag_id}", schedule=None, start_date=START, catchup=False, tags=["dupguard-fixture"]):
    EmptyOperator(task_id="publish", outlets=[{asset_expr}])
"""


def consumer_dag(dag_id: str, schedule_expr: str) -> str:
    return f"""
with DAG("{dag_id}", schedule={schedule_expr}, start_date=START, catchup=False, tags=["dupguard-fixture"]):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")
"""


def daily_dag(dag_id: str) -> str:
    return f"""
with DAG("{dag_id}", schedule="@daily", start_date=START, catchup=False, tags=["dupguard-fixture"]):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")
"""


# --------------------------------------------------------------------------------------------------
# Thin wrappers over Airflow APIs whose shape differs between 3.0 and 3.1
# --------------------------------------------------------------------------------------------------


class AF:
    """Airflow entry points used by the scenarios, resolved once for the installed version."""

    def __init__(self) -> None:
        import airflow
        from airflow import settings
        from airflow.assets.manager import AssetManager
        from airflow.jobs.job import Job
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
        from airflow.models.asset import AssetModel
        from airflow.models.dag import DagModel
        from airflow.models.dagrun import DagRun
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.models.taskinstance import TaskInstance, clear_task_instances
        from airflow.utils.session import create_session
        from airflow.utils.sqlalchemy import prohibit_commit
        from airflow.utils.state import DagRunState, TaskInstanceState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        self.version = airflow.__version__
        self.settings = settings
        self.AssetManager = AssetManager
        self.Job = Job
        self.SchedulerJobRunner = SchedulerJobRunner
        self.AssetModel = AssetModel
        self.DagModel = DagModel
        self.DagRun = DagRun
        self.SerializedDagModel = SerializedDagModel
        self.TaskInstance = TaskInstance
        self.clear_task_instances = clear_task_instances
        self.create_session = create_session
        self.prohibit_commit = prohibit_commit
        self.DagRunState = DagRunState
        self.TIState = TaskInstanceState
        self.TriggeredBy = DagRunTriggeredByType
        self.DagRunType = DagRunType

    # DAG parsing + serialization -----------------------------------------------------------------
    def sync_dags(self, dags_folder: Path) -> list[str]:
        from airflow.dag_processing.bundles.manager import DagBundlesManager

        try:  # 3.2+ (airflow.models.dagbag is a deprecated shim without sync_bag_to_db there)
            from airflow.dag_processing import dagbag as dagbag_mod
        except ImportError:
            from airflow.models import dagbag as dagbag_mod  # type: ignore[no-redef]

        DagBundlesManager().sync_bundles_to_db()
        if "include_examples" in inspect.signature(dagbag_mod.DagBag).parameters:
            bag = dagbag_mod.DagBag(dag_folder=str(dags_folder), include_examples=False)
        else:  # 3.3 dropped the argument (examples are off by the environment above)
            bag = dagbag_mod.DagBag(dag_folder=str(dags_folder))
        if bag.import_errors:
            raise SystemExit(f"DAG import errors: {bag.import_errors}")
        with self.create_session() as session:
            if hasattr(dagbag_mod, "sync_bag_to_db"):  # 3.1+
                dagbag_mod.sync_bag_to_db(bag, "dags-folder", None, session=session)
            else:  # 3.0
                bag.sync_to_db("dags-folder", None, session=session)
        with self.create_session() as session:
            for dm in session.query(self.DagModel).filter(self.DagModel.dag_id.in_(list(bag.dags))):
                dm.is_paused = False
        return sorted(bag.dags)

    # Scheduler jobs ---------------------------------------------------------------------------------
    def new_scheduler(self, hostname: str) -> Any:
        job = self.Job()
        job.hostname = hostname  # the pod name of an HA scheduler; identifies creating_job_id
        runner = self.SchedulerJobRunner(job=job, num_runs=1)
        job.state = "running"
        with self.create_session() as session:
            session.add(job)
        return runner

    def create_runs(self, runner: Any) -> None:
        """The run-creation step of one scheduler loop, in its own session, committed by Airflow."""
        session = self.settings.Session()
        try:
            with self.prohibit_commit(session) as guard:
                runner._create_dagruns_for_dags(guard=guard, session=session)
        finally:
            session.close()
            self.settings.Session.remove()

    # Runs created by people ------------------------------------------------------------------------
    def trigger(self, dag_id: str, **kw: Any) -> Any:
        from airflow.api.common.trigger_dag import trigger_dag

        if "triggering_user_name" in inspect.signature(trigger_dag).parameters:
            kw.setdefault("triggering_user_name", "admin")
        with self.create_session() as session:
            dr = trigger_dag(dag_id, triggered_by=self.TriggeredBy.REST_API, session=session, **kw)
            return dr.run_id

    def backfill(self, dag_id: str, from_date: datetime, to_date: datetime) -> Any:
        from airflow.models.backfill import _create_backfill

        kw: dict[str, Any] = {}
        if "triggering_user_name" in inspect.signature(_create_backfill).parameters:
            kw["triggering_user_name"] = "admin"
        return _create_backfill(
            dag_id=dag_id,
            from_date=from_date,
            to_date=to_date,
            max_active_runs=2,
            reverse=False,
            dag_run_conf=None,
            **kw,
        )

    # Asset events -----------------------------------------------------------------------------------
    def emit(self, producer_dag_id: str, asset_name: str) -> int:
        """A manual producer run whose `publish` task succeeds and emits one asset event."""
        run_id = self.trigger(producer_dag_id)
        with self.create_session() as session:
            ti = session.query(self.TaskInstance).filter_by(dag_id=producer_dag_id, run_id=run_id).one()
            end = _utcnow()
            self.finish_ti(ti, end - timedelta(seconds=2), end)
            dr = session.query(self.DagRun).filter_by(dag_id=producer_dag_id, run_id=run_id).one()
            dr.state = self.DagRunState.SUCCESS
            dr.start_date, dr.end_date = end - timedelta(seconds=3), end
            session.merge(ti)
            asset = session.query(self.AssetModel).filter_by(name=asset_name).one()
            event = self.AssetManager.register_asset_change(task_instance=ti, asset=asset, session=session)
            session.flush()
            return int(event.id)

    def finish_ti(self, ti: Any, start: datetime, end: datetime) -> None:
        """A task instance that ran: state, dates and duration set on the ORM object."""
        ti.state = self.TIState.SUCCESS
        ti.try_number = max(ti.try_number or 0, 1)
        ti.start_date, ti.end_date = start, end
        ti.duration = (end - start).total_seconds()
        ti.hostname = "worker-1"

    def runs(self, dag_id: str | None = None) -> list[dict[str, Any]]:
        with self.create_session() as session:
            q = session.query(self.DagRun)
            if dag_id:
                q = q.filter(self.DagRun.dag_id == dag_id)
            out = []
            for dr in q.order_by(self.DagRun.id):
                out.append(
                    {
                        "id": dr.id,
                        "dag_id": dr.dag_id,
                        "run_id": dr.run_id,
                        "run_type": str(dr.run_type.value if hasattr(dr.run_type, "value") else dr.run_type),
                        "run_after": dr.run_after.isoformat() if dr.run_after else None,
                        "creating_job_id": dr.creating_job_id,
                        "clear_number": dr.clear_number,
                        "event_ids": sorted(e.id for e in dr.consumed_asset_events),
                    }
                )
            return out


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --------------------------------------------------------------------------------------------------
# The race
# --------------------------------------------------------------------------------------------------


def race(af: AF, sched_a: Any, sched_b: Any, between: Callable[[], object] | None = None) -> None:
    """A and B both run the run-creation step; B read the ADRQ before A committed.

    ``between`` (optional) runs while B is held after its unlocked queue read and before A starts:
    whatever it commits (e.g. a second asset's event) is seen by A but not by B's stale snapshot.
    With it, ``race`` is the overlap race of ``sc_race_overlap``: for a DAG on ``a1 | a2`` B read the
    queue when only a1's row existed (triggered_date t1), A reads both rows (t2 > t1), creates
    run_after t2 with events {e1, e2} and commits; B then creates run_after t1 and consumes {e1}
    again, because its event window ``(max(run_after < t1), t1]`` does not see A's later run
    (3.0.6 scheduler_job_runner.py L1633-1653, 3.1.2 L1679-1707).
    """
    b_has_read_queue = threading.Event()
    a_committed = threading.Event()
    original = af.SerializedDagModel.get_latest_serialized_dags  # bound classmethod
    state = {"paused": False}
    errors: list[BaseException] = []

    def held(cls: Any, *args: Any, **kwargs: Any) -> Any:
        # Called by dags_needing_dagruns right after its unlocked `SELECT asset_dag_run_queue`.
        if threading.current_thread().name == "scheduler-b" and not state["paused"]:
            state["paused"] = True
            b_has_read_queue.set()
            if not a_committed.wait(60):
                raise TimeoutError("scheduler-a did not finish")
        return original(*args, **kwargs)

    def run(runner: Any) -> None:
        try:
            af.create_runs(runner)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)
            b_has_read_queue.set()

    af.SerializedDagModel.get_latest_serialized_dags = classmethod(held)  # type: ignore[method-assign]
    try:
        tb = threading.Thread(target=run, args=(sched_b,), name="scheduler-b")
        tb.start()
        if not b_has_read_queue.wait(60):
            raise TimeoutError("scheduler-b never reached the queue read")
        if between is not None and not errors:
            try:
                between()
            except BaseException:
                a_committed.set()  # let B finish rather than wait out its timeout
                tb.join(60)
                raise
        ta = threading.Thread(target=run, args=(sched_a,), name="scheduler-a")
        ta.start()
        ta.join(60)
        a_committed.set()
        tb.join(60)
    finally:
        af.SerializedDagModel.get_latest_serialized_dags = original  # type: ignore[method-assign]
    if errors:
        raise errors[0]
    if not state["paused"]:
        raise RuntimeError("scheduler-b was never held: the race did not happen")


def duplicate_groups(
    af: AF, dag_ids: list[str], first_job_id: int, dup_job_id: int, after_id: int
) -> list[dict[str, Any]]:
    """Ground truth from the race: per DAG, the run scheduler A made and the one B made again."""
    groups = []
    for dag_id in dag_ids:
        asset_runs = [r for r in af.runs(dag_id) if r["run_type"] == "asset_triggered" and r["id"] > after_id]
        first = [r for r in asset_runs if r["creating_job_id"] == first_job_id]
        dup = [r for r in asset_runs if r["creating_job_id"] == dup_job_id]
        if len(first) != 1 or len(dup) != 1:
            raise AssertionError(f"{dag_id}: expected one run per scheduler, got {asset_runs}")
        f, d = first[0], dup[0]
        # The facts (section 2.3) predict these; fail loudly if this Airflow behaves otherwise.
        assert f["run_after"] == d["run_after"], (f, d)
        assert f["event_ids"] == d["event_ids"] and f["event_ids"], (f, d)
        assert f["id"] < d["id"], (f, d)
        groups.append(
            {
                "dag_id": dag_id,
                "kind": "asset",
                "confidence": "confirmed",
                "run_ids": [f["run_id"], d["run_id"]],
                "first_run_id": f["run_id"],
                "shared_event_ids": f["event_ids"],
                "run_after": f["run_after"],
                "creating_job_ids": [first_job_id, dup_job_id],
                "duplicate_task_seconds": 0.0,
            }
        )
    return groups


def set_run_outcome(af: AF, dag_id: str, run_id: str, task_seconds: dict[str, float], finished: bool) -> float:
    """Mark some TIs of a run as run (ORM objects); returns their summed duration."""
    total = 0.0
    with af.create_session() as session:
        dr = session.query(af.DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
        t0 = dr.queued_at + timedelta(seconds=1)
        dr.state = af.DagRunState.SUCCESS if finished else af.DagRunState.RUNNING
        dr.start_date = t0
        cursor = t0
        for ti in sorted(dr.task_instances, key=lambda t: t.task_id != "extract"):
            if ti.task_id in task_seconds:
                secs = task_seconds[ti.task_id]
                af.finish_ti(ti, cursor, cursor + timedelta(seconds=secs))
                cursor += timedelta(seconds=secs)
                total += secs
        if finished:
            dr.end_date = cursor
    return total


# --------------------------------------------------------------------------------------------------
# Scenarios: each returns (description, dag files, body) where body(af) -> expected_groups
# --------------------------------------------------------------------------------------------------

Scenario = tuple[str, str, Callable[[AF], list[dict[str, Any]]]]


def sc_race_asset() -> Scenario:
    files = DAG_HEADER + producer_dag("orders_producer", ORDERS) + consumer_dag("orders_consumer", f"[{ORDERS}]")

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # an ordinary earlier run; bounds the event window of the later ones
        (earlier,) = [r for r in af.runs("orders_consumer")]
        set_run_outcome(af, "orders_consumer", earlier["run_id"], {"extract": 10, "load": 10}, True)
        time.sleep(0.05)
        af.emit("orders_producer", "orders")
        before = max(r["id"] for r in af.runs())
        race(af, a, b)
        groups = duplicate_groups(af, ["orders_consumer"], a.job.id, b.job.id, before)
        g = groups[0]
        set_run_outcome(af, "orders_consumer", g["first_run_id"], {"extract": 30, "load": 30}, True)
        g["duplicate_task_seconds"] = set_run_outcome(af, "orders_consumer", g["run_ids"][1], {"extract": 12.5}, False)
        return groups

    return (
        "Two HA schedulers race on one asset-triggered DAG: scheduler-b read the asset queue before "
        "scheduler-a committed its run, then created the same run again (same run_after, same consumed "
        "events). First run: extract+load success, 30 s each. Duplicate: extract success in 12.5 s, "
        "load not started. An earlier ordinary run of the same DAG exists.",
        files,
        body,
    )


def sc_race_asset_fanout() -> Scenario:
    consumers = [f"orders_consumer_{i}" for i in (1, 2, 3)]
    files = DAG_HEADER + producer_dag("orders_producer", ORDERS)
    files += "".join(consumer_dag(c, f"[{ORDERS}]") for c in consumers)

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        af.emit("orders_producer", "orders")
        before = max(r["id"] for r in af.runs())
        race(af, a, b)
        return duplicate_groups(af, consumers, a.job.id, b.job.id, before)

    return (
        "The same race with three consumer DAGs of one asset: one event, each consumer gets a "
        "duplicate pair (all runs queued, no task started).",
        files,
        body,
    )


def sc_fanout() -> Scenario:
    consumers = [f"orders_consumer_{i}" for i in (1, 2, 3)]
    files = DAG_HEADER + producer_dag("orders_producer", ORDERS)
    files += "".join(consumer_dag(c, f"[{ORDERS}]") for c in consumers)

    def body(af: AF) -> list[dict[str, Any]]:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        runs = [r for r in af.runs() if r["run_type"] == "asset_triggered"]
        assert sorted(r["dag_id"] for r in runs) == consumers, runs
        return []

    return (
        "One asset event, three consumer DAGs, one scheduler: one run per consumer DAG, all with the "
        "same run_after and the same consumed event. Not a duplicate (different DAGs).",
        files,
        body,
    )


def sc_successive() -> Scenario:
    files = DAG_HEADER + producer_dag("orders_producer", ORDERS) + consumer_dag("orders_consumer", f"[{ORDERS}]")

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        for i in range(4):
            af.emit("orders_producer", "orders")
            if i == 1:
                af.emit("orders_producer", "orders")  # two events consumed by one run
            af.create_runs(a if i % 2 == 0 else b)  # HA: the schedulers take turns, no race
            time.sleep(0.05)
        runs = af.runs("orders_consumer")
        assert len(runs) == 4 and len({r["run_after"] for r in runs}) == 4, runs
        seen: set[int] = set()
        for r in runs:
            assert r["event_ids"] and not (seen & set(r["event_ids"])), runs
            seen |= set(r["event_ids"])
        for r in runs[:3]:
            set_run_outcome(af, "orders_consumer", r["run_id"], {"extract": 5, "load": 7}, True)
        return []

    return (
        "Five events over time and four run-creation steps (two HA schedulers taking turns, no race): "
        "four ordinary runs of one consumer, distinct run_after, disjoint consumed events. The second "
        "event of round 2 arrived while its queue row already existed (ON CONFLICT DO NOTHING), so it "
        "is consumed by the next run, which has two events.",
        files,
        body,
    )


def sc_manual_scheduled_backfill() -> Scenario:
    files = (
        DAG_HEADER
        + daily_dag("daily_etl")
        + producer_dag("orders_producer", ORDERS)
        + consumer_dag("orders_consumer", f"[{ORDERS}]")
    )

    def body(af: AF) -> list[dict[str, Any]]:
        a = af.new_scheduler("scheduler-a")
        af.create_runs(a)  # scheduled run of daily_etl (catchup=False: the latest interval)
        af.trigger("daily_etl")  # manual
        af.trigger("orders_consumer")  # a manual run of the asset-scheduled DAG
        today = _utcnow().replace(hour=0, minute=0, second=0, microsecond=0)
        af.backfill("daily_etl", today - timedelta(days=5), today - timedelta(days=3))
        for _ in range(2):
            af.emit("orders_producer", "orders")
            af.create_runs(a)
            time.sleep(0.05)
        runs = af.runs()
        kinds = {r["run_type"] for r in runs}
        assert {"scheduled", "manual", "backfill", "asset_triggered"} <= kinds, kinds
        return []

    return (
        "Ordinary runs of every other type next to asset runs: a scheduled and a manual run of a daily "
        "DAG, a backfill of three days of it, a manual run of the asset-scheduled DAG, and two "
        "successive asset-triggered runs. Nothing is a duplicate.",
        files,
        body,
    )


def sc_and_premature() -> Scenario:
    files = (
        DAG_HEADER
        + producer_dag("orders_producer", ORDERS)
        + producer_dag("customers_producer", CUSTOMERS)
        + consumer_dag("orders_x_customers", f"({ORDERS} & {CUSTOMERS})")
    )

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        # Round 1: orders twice, then customers -> one run consuming all three events.
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # not ready yet (customers missing): no run
        af.emit("orders_producer", "orders")
        af.emit("customers_producer", "customers")
        # Both schedulers take a turn (no hold: an interleaved B would either see the same rows as A,
        # giving an exact duplicate, or an empty queue; see the description below).
        af.create_runs(a)
        af.create_runs(b)  # sees an empty queue
        time.sleep(0.05)
        # Round 2: customers, then orders -> a second run with disjoint events.
        af.emit("customers_producer", "customers")
        af.create_runs(b)  # not ready (orders missing)
        af.emit("orders_producer", "orders")
        af.create_runs(b)
        runs = af.runs("orders_x_customers")
        assert len(runs) == 2 and runs[0]["run_after"] != runs[1]["run_after"], runs
        assert not set(runs[0]["event_ids"]) & set(runs[1]["event_ids"]), runs
        assert len(runs[0]["event_ids"]) == 3 and len(runs[1]["event_ids"]) == 2, runs
        return []

    return (
        "A DAG scheduled on orders & customers: two successive AND-condition runs (made by two HA "
        "schedulers taking turns) with disjoint consumed events (3 and 2 events). The 'premature run' "
        "variant could not be produced with two threads on this version: queue rows are inserted with "
        "ON CONFLICT DO NOTHING and A's DELETE holds them until A commits, so a stale reader never "
        "sees a queue row newer than A's snapshot for an AND-ready DAG.",
        files,
        body,
    )


def sc_cleared() -> Scenario:
    files = DAG_HEADER + producer_dag("orders_producer", ORDERS) + consumer_dag("orders_consumer", f"[{ORDERS}]")

    def body(af: AF) -> list[dict[str, Any]]:
        a = af.new_scheduler("scheduler-a")
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        (run,) = af.runs("orders_consumer")
        set_run_outcome(af, "orders_consumer", run["run_id"], {"extract": 4, "load": 6}, True)
        with af.create_session() as session:
            tis = session.query(af.TaskInstance).filter_by(dag_id="orders_consumer", run_id=run["run_id"]).all()
            af.clear_task_instances(tis, session)
        (after,) = af.runs("orders_consumer")
        assert after["id"] == run["id"] and after["clear_number"] == run["clear_number"] + 1, after
        # A second, later asset run so the DAG has more than one run.
        af.emit("orders_producer", "orders")
        af.create_runs(a)
        return []

    return (
        "An asset run whose task instances were cleared with Airflow's clear_task_instances after it "
        "succeeded: the same dag_run row is re-queued (clear_number 1, TIs reset), followed by an "
        "ordinary later asset run. Nothing is a duplicate.",
        files,
        body,
    )


def sc_race_or_disjoint() -> Scenario:
    files = (
        DAG_HEADER
        + producer_dag("orders_producer", ORDERS)
        + producer_dag("customers_producer", CUSTOMERS)
        + consumer_dag("orders_or_customers", f"({ORDERS} | {CUSTOMERS})")
    )

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        af.emit("orders_producer", "orders")
        # Hold A after ITS queue read, add a customers event, let B read and hold, then A commits
        # (deleting the customers queue row too) and B creates a run from its newer snapshot.
        a_read, release_a, b_read, release_b = (threading.Event() for _ in range(4))
        original = af.SerializedDagModel.get_latest_serialized_dags
        held_once: set[str] = set()

        def held(cls: Any, *args: Any, **kwargs: Any) -> Any:
            name = threading.current_thread().name
            if name not in held_once and name in ("scheduler-a", "scheduler-b"):
                held_once.add(name)
                (a_read if name == "scheduler-a" else b_read).set()
                (release_a if name == "scheduler-a" else release_b).wait(60)
            return original(*args, **kwargs)

        errors: list[BaseException] = []

        def run(runner: Any) -> None:
            try:
                af.create_runs(runner)
            except BaseException as e:  # noqa: BLE001 - re-raised below
                errors.append(e)

        af.SerializedDagModel.get_latest_serialized_dags = classmethod(held)  # type: ignore[method-assign]
        try:
            ta = threading.Thread(target=run, args=(a,), name="scheduler-a")
            ta.start()
            assert a_read.wait(60)
            af.emit("customers_producer", "customers")
            tb = threading.Thread(target=run, args=(b,), name="scheduler-b")
            tb.start()
            assert b_read.wait(60)
            release_a.set()
            ta.join(60)
            release_b.set()
            tb.join(60)
        finally:
            af.SerializedDagModel.get_latest_serialized_dags = original  # type: ignore[method-assign]
        if errors:
            raise errors[0]
        runs = af.runs("orders_or_customers")
        assert len(runs) == 2, runs
        assert runs[0]["run_after"] != runs[1]["run_after"], runs
        assert runs[0]["event_ids"] and runs[1]["event_ids"], runs
        assert not set(runs[0]["event_ids"]) & set(runs[1]["event_ids"]), runs
        return []

    return (
        "A real two-scheduler race that is NOT a duplicate: DAG on orders | customers. scheduler-a read "
        "the queue (orders only); a customers event arrived; scheduler-b read the queue (orders + "
        "customers); A created a run (orders event) and deleted all queue rows; B then created a second "
        "run with a later run_after that consumed only the customers event. Disjoint events.",
        files,
        body,
    )


def sc_race_overlap() -> Scenario:
    files = (
        DAG_HEADER
        + producer_dag("orders_producer", ORDERS)
        + producer_dag("customers_producer", CUSTOMERS)
        + consumer_dag("orders_or_customers", f"({ORDERS} | {CUSTOMERS})")
    )

    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        af.emit("orders_producer", "orders")
        af.create_runs(a)  # an ordinary earlier run: the event window of the race has a real floor
        (earlier,) = af.runs("orders_or_customers")
        set_run_outcome(af, "orders_or_customers", earlier["run_id"], {"extract": 3, "load": 4}, True)
        time.sleep(0.05)
        e1 = af.emit("orders_producer", "orders")
        before = max(r["id"] for r in af.runs())
        time.sleep(0.05)
        emitted: list[int] = []
        race(af, a, b, between=lambda: emitted.append(af.emit("customers_producer", "customers")))
        (e2,) = emitted
        runs = [r for r in af.runs("orders_or_customers") if r["id"] > before]
        first = [r for r in runs if r["creating_job_id"] == a.job.id]
        dup = [r for r in runs if r["creating_job_id"] == b.job.id]
        if len(first) != 1 or len(dup) != 1:
            raise AssertionError(f"expected one run per scheduler, got {runs}")
        f, d = first[0], dup[0]
        # What this scenario exists to show; fail loudly if this Airflow behaves otherwise.
        assert f["id"] < d["id"], (f, d)
        assert f["event_ids"] == sorted([e1, e2]), (f, e1, e2)
        assert d["event_ids"] == [e1], (d, e1)
        assert d["run_after"] < f["run_after"], (f, d)
        return [
            {
                "dag_id": "orders_or_customers",
                "kind": "asset",
                "confidence": "confirmed",
                "run_ids": [f["run_id"], d["run_id"]],
                "first_run_id": f["run_id"],
                "shared_event_ids": [e1],
                "run_after": f["run_after"],
                "creating_job_ids": [a.job.id, b.job.id],
                "duplicate_task_seconds": 0.0,
            }
        ]

    return (
        "A race whose two runs have different run_after but share an asset event: DAG on orders | "
        "customers. scheduler-b read the queue while only the orders row existed (triggered_date t1) and "
        "was held; a customers event arrived; scheduler-a read both rows, created run_after t2 with both "
        "events and committed; b then created run_after t1 < t2 consuming the orders event again (its "
        "event window ends at t1 and does not see a's later run). An earlier ordinary run exists.",
        files,
        body,
    )


# Extra ground-truth keys another generator built on these shims adds (scenarios_stranded.py).
EXTRA_TRUTH: dict[str, Any] = {}

SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "race_overlap": sc_race_overlap,
    "race_asset": sc_race_asset,
    "race_asset_fanout": sc_race_asset_fanout,
    "fanout": sc_fanout,
    "successive": sc_successive,
    "manual_scheduled_backfill": sc_manual_scheduled_backfill,
    "and_premature": sc_and_premature,
    "cleared": sc_cleared,
    "race_or_disjoint": sc_race_or_disjoint,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--out-json", required=True)
    args = ap.parse_args()

    description, files, body = SCENARIOS[args.scenario]()
    dags_folder = Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER") or Path(os.environ["AIRFLOW_HOME"]) / "dags")
    dags_folder.mkdir(parents=True, exist_ok=True)
    (dags_folder / "fixture_dags.py").write_text(textwrap.dedent(files))

    af = AF()
    af.sync_dags(dags_folder)
    expected = body(af)
    runs = af.runs()
    doc = {
        "scenario": args.scenario,
        "airflow_version": af.version,
        "description": description,
        "expected_groups": expected,
        "all_run_ids": [r["run_id"] for r in runs],
        "runs": runs,
        "generator": f"scripts/airflow/{Path(sys.argv[0]).name}",
        **EXTRA_TRUTH,
    }
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"{args.scenario}: {len(runs)} runs, {len(expected)} duplicate groups", file=sys.stderr)


if __name__ == "__main__":
    main()

"""A compressed day of a busy HA deployment, made by Airflow's OWN code (3.1.x and 3.3.x), with a few planted
members of every kind dupguard finds there.

Why: each check was tried on small histories made for it; a false page on a long history costs more trust
than a miss. Here everything a real day has happens in one database, in minutes instead of hours, and
``dupguard scan`` must find exactly what was planted (tests/integration/test_busy_day.py). Every row is
written by Airflow:

* DAG files parsed and stored by its DAG-processing code (``scenarios_asset.AF.sync_dags``; 3.2+
  ``scenarios_partitioned.serialize_dags``, which also creates the watchers' triggers).
* Schedulers: ``SchedulerJobRunner`` objects with their own ``Job`` rows; a tick is one ``_do_scheduling``
  (run creation, run scheduling, the critical section queueing TIs) of one of the two live schedulers, in
  turn. Workloads stay in the executor (``scenarios_double_bump.scheduler_loop``); the workers' side is the
  execution API's own route functions: ``ti_run`` (start), ``ti_update_state`` with the payload a task
  runner sends (success with its outlets, which registers the asset events; retry; reschedule; defer).
* Rolling deploys: a scheduler ends (``Job.complete_execution``, state success), its replacement starts and
  runs ``adopt_or_reset_orphaned_tasks`` as ``SchedulerJobRunner._execute`` does at start (what the old one
  had queued or running goes back to None and is scheduled again: an orphan reset, not a double bump). A
  scheduler pod killed: its job stays running, its heartbeat goes stale, the other scheduler's periodic
  orphan check marks it failed and resets its tasks. A triggerer restarts. ``[scheduler]
  scheduler_health_check_threshold`` 5 s and ``orphaned_tasks_check_interval`` 10 s
  (``notes.orphan_timing``: dupguard is given the same values).
* Hourly catch-up of a day (``hourly_etl``: a reschedule sensor, a deferrable sensor whose
  ``DateTimeTrigger`` fires through ``Trigger.submit_event``, a flaky task retried once, mapped tasks, a
  task whose outlet makes asset events), manual runs (``trigger_dag``), a backfill (``_create_backfill``),
  asset events from tasks, pauses and unpauses with the CLI in this process (``log`` rows), clears
  (``clear_task_instances``), asset watchers run by two triggerers (``Trigger.submit_event`` of each claimed
  copy), a missed deadline (``Deadline.handle_miss``: a callback trigger). The REST API is Airflow's own app
  served in this process (``Rest``): asset events, pauses and unpauses (``patch_dag`` log rows), a clear, a
  manual run.
* Planted, with the helpers of the scenario scripts: an asset duplicate (``scenarios_asset.race``), a
  double bump (``scenarios_double_bump.bumped``), a stranded pair (``scenarios_stranded.held_creation``),
  an event committed late (``scenarios_stranded.held_emit``), one SQS message submitted by both
  triggerers' copies of a watcher (a ``trigger_event`` pair) and one Redis message likewise (suspected
  copies), and the exposure of every trigger both triggerers' loops returned. On 3.2+ the same steps make
  no asset duplicate, no double bump and no second copy (the fixes): what is planted there is what
  Airflow still lets happen.

The ground truth (``--out-json``) is what Airflow recorded for the planted ones (which job made which run,
each run's events, the TI rows before and after the stale update, what each triggerer's loop returned),
plus checks that the rest of the day left nothing of the kind: every event consumed, every try above 1
with its history row or reset by an orphan check.

Run through scripts/airflow/regen_busy_day.sh (fresh migrated DB, dump, load check).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# The orphan timing of this deployment (dupguard's double_bump settings are given the same values).
HEALTH_CHECK_THRESHOLD_S = 5
ORPHAN_CHECK_INTERVAL_S = 10
os.environ["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD"] = str(HEALTH_CHECK_THRESHOLD_S)
os.environ["AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL"] = str(ORPHAN_CHECK_INTERVAL_S)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import scenarios_asset as sa  # noqa: E402 - after the environment above
import scenarios_double_bump as sdb  # noqa: E402
import scenarios_stranded as ss  # noqa: E402
import scenarios_trigger_event as ste  # noqa: E402
import scenarios_triggers as st  # noqa: E402

HOME = Path(os.environ["AIRFLOW_HOME"])
PAYMENTS_QUEUE = HOME / "payments.json"  # SQS-shaped messages (a MessageId each)
CLICKS_QUEUE = HOME / "clicks.json"  # Redis pub/sub messages (no id)
PARTNER_FILE = HOME / "partner.ready"

DAGS = """\
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.sensors.filesystem import FileSensor
from airflow.providers.standard.sensors.time_delta import TimeDeltaSensor
from airflow.sdk import DAG, Asset, AssetWatcher
from queue_triggers import QueueFileTrigger

START = datetime.fromisoformat("{start}")
orders = Asset(name="orders", uri="s3://warehouse/orders")
customers = Asset(name="customers", uri="s3://warehouse/customers")
inventory = Asset(name="inventory", uri="s3://warehouse/inventory")
refunds = Asset(name="refunds", uri="s3://warehouse/refunds")
shipments = Asset(name="shipments", uri="s3://warehouse/shipments")
payments = Asset(name="payments", uri="sqs://payments", watchers=[AssetWatcher(
    name="payments_watcher", trigger=QueueFileTrigger(path="{payments}", shape="sqs"))])
clicks = Asset(name="clicks", uri="redis://clicks", watchers=[AssetWatcher(
    name="clicks_watcher", trigger=QueueFileTrigger(path="{clicks}", shape="redis"))])

with DAG("hourly_etl", schedule="@hourly", start_date=START, catchup=True, max_active_runs=4):
    wait = FileSensor(task_id="wait_for_partner", filepath="{partner}", mode="reschedule", poke_interval=5)
    window = TimeDeltaSensor(task_id="wait_window", delta=timedelta(seconds=1), deferrable=True)
    extract = BashOperator(task_id="extract", bash_command="true", retries=1, retry_delay=timedelta(0))
    shards = BashOperator.partial(task_id="transform").expand(bash_command=["echo 1", "echo 2", "echo 3"])
    publish = EmptyOperator(task_id="publish", outlets=[customers])
    [wait, window] >> extract >> shards >> publish

with DAG("daily_report", schedule="@daily", start_date=START, catchup=False):
    EmptyOperator(task_id="report")

with DAG("late_report", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="report")

for producer, asset in (
    ("orders_producer", orders),
    ("inventory_producer", inventory),
    ("refunds_producer", refunds),
    ("shipments_producer", shipments),
):
    with DAG(producer, schedule=None, start_date=START, catchup=False):
        EmptyOperator(task_id="publish", outlets=[asset])

for consumer, schedule in (
    ("orders_consumer", [orders]),
    ("orders_or_customers", orders | customers),
    ("inventory_consumer", [inventory]),
    ("refunds_consumer", [refunds]),
    ("shipments_consumer", [shipments]),
    ("payments_consumer", [payments]),
    ("clicks_consumer", [clicks]),
):
    with DAG(consumer, schedule=schedule, start_date=START, catchup=False):
        EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")

with DAG("etl", schedule=None, start_date=START, catchup=False):
    BashOperator(task_id="load", bash_command="sleep 60", retries=2, retry_delay=timedelta(seconds=0))
"""
OUTLETS = {
    ("hourly_etl", "publish"): "customers",
    ("orders_producer", "publish"): "orders",
    ("inventory_producer", "publish"): "inventory",
    ("shipments_producer", "publish"): "shipments",
}
ASSETS = {
    "orders": "s3://warehouse/orders",
    "customers": "s3://warehouse/customers",
    "inventory": "s3://warehouse/inventory",
    "refunds": "s3://warehouse/refunds",
    "shipments": "s3://warehouse/shipments",
}


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _version() -> tuple[int, ...]:
    import airflow

    return tuple(int(p) for p in airflow.__version__.split(".")[:3])


class Day:
    """The deployment: two live schedulers, two triggerers, the workers, and a log of what happened."""

    def __init__(self, af: sa.AF) -> None:
        self.af = af
        self.schedulers = [af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")]
        self.triggerers = [st.new_triggerer("triggerer-a"), st.new_triggerer("triggerer-b")]
        self.turn = 0
        self.pending: list[str] = []  # TI ids a worker runs, to report on at the next tick
        self.deploys: list[dict[str, Any]] = []
        self.resets: list[dict[str, Any]] = []  # TIs an orphan check set back (what it returned, which rows)
        self.timeline: list[dict[str, Any]] = []
        self.counts: dict[str, int] = {}
        self.claims: dict[int, set[int]] = {}  # trigger id -> the triggerer jobs whose loop returned it
        self.rest = Rest()

    def load_triggers(self, t: Any) -> list[int]:
        """One triggerer loop's database part (``scenarios_triggers.load_triggers``); what it returned is kept."""
        owned = st.load_triggers(t)
        for trigger_id in owned:
            self.claims.setdefault(trigger_id, set()).add(int(t.id))
        return owned

    # -- the deployment -------------------------------------------------------------------------------
    def note(self, what: str, **kw: Any) -> None:
        self.timeline.append({"at": _utcnow().isoformat(), "what": what, **kw})

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def heartbeat(self) -> None:
        sdb._heartbeat(self.af, *self.schedulers)

    def tick(self, n: int = 1) -> None:
        """``n`` scheduler loops, the two schedulers taking turns; after each the workers report on what they
        ran and start what was queued."""
        for _ in range(n):
            self.heartbeat()
            runner = self.schedulers[self.turn % 2]
            self.turn += 1
            sdb.scheduler_loop(self.af, runner)
            self.work()
            self.start_queued(runner)

    def start_queued(self, runner: Any) -> None:
        executors = getattr(runner.job, "executors", None) or runner.executors
        for executor in executors:
            for key, workload in list(executor.queued_tasks.items()):
                del executor.queued_tasks[key]  # a worker took it
                ti_id = str(workload.ti.id)
                if worker_run(self.af, ti_id, f"worker-{1 + self.turn % 3}"):
                    self.pending.append(ti_id)

    def work(self) -> None:
        """Each task a worker ran reports its outcome through the execution API, as its task runner would."""
        pending, self.pending = self.pending, []
        for ti_id in pending:
            row = ti_state(self.af, ti_id)
            if row is None or row["state"] != "running":
                continue  # reset by an orphan check (or cleared) meanwhile: the worker's report is refused
            outcome = self.outcome(row)
            self.count(outcome)
            report(self.af, ti_id, row, outcome)

    def outcome(self, row: dict[str, Any]) -> str:
        if row["task_id"] == "wait_for_partner" and not row["rescheduled"]:
            return "reschedule"
        if row["task_id"] == "wait_window" and row["next_method"] is None:
            return "defer"
        first_try = row["task_id"] == "extract" and row["dag_id"] == "hourly_etl" and row["try_number"] == 1
        if first_try and int(row["run_id"][-14:-12]) % 3 == 0:  # every third hour's extract fails once
            return "retry"
        return "success"

    def fire_triggers(self) -> None:
        """The triggerers' side of deferred tasks: each triggerer claims what it may, the fired
        ``DateTimeTrigger`` submits its event (the task goes back to scheduled with its next_method)."""
        from airflow.models.trigger import Trigger
        from airflow.triggers.base import TriggerEvent
        from sqlalchemy import select

        for t in self.triggerers:
            st.heartbeat(t)
            self.load_triggers(t)
        with self.af.create_session() as session:
            ids = session.scalars(
                select(Trigger.id)
                .join(self.af.TaskInstance, self.af.TaskInstance.trigger_id == Trigger.id)
                .where(self.af.TaskInstance.state == "deferred")
            ).all()
        for trigger_id in ids:
            Trigger.submit_event(trigger_id, TriggerEvent(_utcnow().isoformat()))
            self.count("trigger_fired")

    def deploy_scheduler(self, index: int) -> None:
        """A rolling deploy's step: the scheduler pod ends, its replacement starts (its orphan check first)."""
        while (self.turn - 1) % 2 != index:  # its pod stops right after its own loop: its tasks are in flight
            self.tick()
        old = self.schedulers[index]
        host = old.job.hostname
        old.job.state = "success"  # run_job's execute_job on a clean exit (SIGTERM of a rolling deploy)
        old.job.complete_execution()
        new = self.af.new_scheduler(host)
        self.schedulers[index] = new
        self.heartbeat()
        reset = orphan_check(self.af, new)
        self.deploys.append(
            {"kind": "scheduler", "host": host, "old_job": old.job.id, "new_job": new.job.id, "reset": reset}
        )
        self.resets.extend(reset)
        self.note("scheduler deploy", host=host, reset=len(reset))

    def crash_scheduler(self, index: int) -> None:
        """A scheduler pod killed (no clean exit: its job stays ``running`` and stops heart-beating; its local
        workers die with it) and replaced at once; the replacement's start-up orphan check finds nothing yet (the
        heartbeat is fresh); after ``scheduler_health_check_threshold`` the other scheduler's periodic orphan check
        marks the job failed and sets its tasks in flight back to None."""
        while (self.turn - 1) % 2 != index:
            self.tick()
        old = self.schedulers[index]
        host, dead = old.job.hostname, int(old.job.id)
        self.pending = [t for t in self.pending if (ti_state(self.af, t) or {}).get("queued_by_job_id") != dead]
        new = self.af.new_scheduler(host)
        self.schedulers[index] = new
        self.heartbeat()
        at_start = orphan_check(self.af, new)
        ss.check(not at_start, f"nothing to reset while the killed pod's heartbeat is fresh: {at_start}")
        until = time.monotonic() + HEALTH_CHECK_THRESHOLD_S + 1
        while time.monotonic() < until:  # the cluster works on
            self.fire_triggers()
            self.tick()
        self.heartbeat()
        reset = orphan_check(self.af, self.schedulers[1 - index])
        self.deploys.append(
            {"kind": "scheduler killed", "host": host, "old_job": dead, "new_job": new.job.id, "reset": reset}
        )
        self.resets.extend(reset)
        self.note("scheduler killed", host=host, reset=len(reset))

    def deploy_triggerer(self, index: int) -> None:
        old = self.triggerers[index]
        old.state = "success"
        old.complete_execution()
        new = st.new_triggerer(old.hostname)
        self.triggerers[index] = new
        st.heartbeat(new)
        self.deploys.append({"kind": "triggerer", "host": old.hostname, "old_job": old.id, "new_job": new.id})
        self.note("triggerer deploy", host=old.hostname)

    def drain(self, max_ticks: int = 40) -> None:
        """Ticks until no run is queued or running (other than the ones left on purpose) and no queue row waits."""
        for _ in range(max_ticks):
            self.fire_triggers()
            self.tick()
            if not busy(self.af):
                return
        raise AssertionError(f"the day did not settle: {busy(self.af)}")


# -- the workers: the execution API's route functions ----------------------------------------------------


def _api() -> tuple[Any, Any]:
    from airflow.api_fastapi.execution_api.routes import task_instances as routes
    from airflow.models.dagbag import DBDagBag

    return routes, DBDagBag()


def worker_run(af: sa.AF, ti_id: str, host: str) -> bool:
    from airflow.api_fastapi.execution_api.datamodels.taskinstance import TIEnterRunningPayload
    from fastapi import HTTPException

    routes, bag = _api()
    payload = TIEnterRunningPayload(state="running", hostname=host, unixname="airflow", pid=4242, start_date=_utcnow())
    import inspect
    from types import SimpleNamespace

    from fastapi import Response

    params = inspect.signature(routes.ti_run).parameters
    extra: dict[str, Any] = {}
    if "response" in params:  # 3.3: the reissued token goes in a header
        extra["response"] = Response()
    if "token" in params:  # 3.3: an execution token (the HTTP layer's auth, not called here), no reissue
        extra["token"] = SimpleNamespace(claims=SimpleNamespace(scope="execution"))
        extra["services"] = None
    with af.create_session() as session:
        try:
            routes.ti_run(
                task_instance_id=uuid.UUID(ti_id), ti_run_payload=payload, session=session, dag_bag=bag, **extra
            )
        except HTTPException:
            return False  # not queued any more (reset or cleared meanwhile)
    return True


def report(af: sa.AF, ti_id: str, row: dict[str, Any], outcome: str) -> None:
    from airflow.api_fastapi.execution_api.datamodels import taskinstance as dm
    from airflow.serialization.serialized_objects import BaseSerialization

    routes, bag = _api()
    now = _utcnow()
    payload: Any
    if outcome == "success":
        asset = OUTLETS.get((row["dag_id"], row["task_id"]))
        outlets = [] if asset is None else [dm.AssetProfile(name=asset, uri=ASSETS[asset], type="Asset")]
        payload = dm.TISuccessStatePayload(state="success", end_date=now, task_outlets=outlets, outlet_events=[])
    elif outcome == "retry":
        payload = dm.TIRetryStatePayload(state="up_for_retry", end_date=now)
    elif outcome == "reschedule":
        payload = dm.TIRescheduleStatePayload(state="up_for_reschedule", reschedule_date=now, end_date=now)
    else:  # defer: what TimeDeltaSensor(deferrable=True) sends (task_runner._defer_task)
        payload = dm.TIDeferredStatePayload(
            state="deferred",
            classpath="airflow.providers.standard.triggers.temporal.DateTimeTrigger",
            trigger_kwargs=BaseSerialization.serialize({"moment": now, "end_from_trigger": False}),
            next_method="execute_complete",
            next_kwargs=BaseSerialization.serialize({}),
        )
    with af.create_session() as session:
        routes.ti_update_state(uuid.UUID(ti_id), payload, session, bag)


def ti_state(af: sa.AF, ti_id: str) -> dict[str, Any] | None:
    from airflow.models.taskreschedule import TaskReschedule
    from sqlalchemy import func, select

    with af.create_session() as session:
        ti = session.get(af.TaskInstance, ti_id)
        if ti is None:
            return None
        n = session.scalar(select(func.count()).select_from(TaskReschedule).where(TaskReschedule.ti_id == ti_id))
        state = None if ti.state is None else str(getattr(ti.state, "value", ti.state))
        return {
            "dag_id": ti.dag_id,
            "task_id": ti.task_id,
            "run_id": ti.run_id,
            "state": state,
            "try_number": ti.try_number,
            "next_method": ti.next_method,
            "rescheduled": bool(n),
            "queued_by_job_id": ti.queued_by_job_id,
        }


def orphan_check(af: sa.AF, runner: Any) -> list[dict[str, Any]]:
    """``adopt_or_reset_orphaned_tasks`` of ``runner``, committed; the rows it set back (read before and after)."""

    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r["dag_id"], r["task_id"], r["run_id"], r["map_index"])

    before = {key(r): r for r in all_tis(af) if r["state"] in ("queued", "running")}
    sdb._adopt_or_reset(af, runner)
    after = {key(r): r for r in all_tis(af)}
    return [
        {
            "ti_id": b["id"],
            "ti_id_after": after[i]["id"],
            "dag_id": b["dag_id"],
            "task_id": b["task_id"],
            "run_id": b["run_id"],
            "map_index": b["map_index"],
            "try_number": b["try_number"],
            "state_before": b["state"],
            "queued_by_job_id": b["queued_by_job_id"],
        }
        for i, b in before.items()
        if i in after and after[i]["state"] is None
    ]


def all_tis(af: sa.AF) -> list[dict[str, Any]]:
    with af.create_session() as session:
        return [
            {
                "id": str(ti.id),
                "dag_id": ti.dag_id,
                "task_id": ti.task_id,
                "run_id": ti.run_id,
                "map_index": ti.map_index,
                "try_number": ti.try_number,
                "state": None if ti.state is None else str(getattr(ti.state, "value", ti.state)),
                "queued_by_job_id": ti.queued_by_job_id,
                "hostname": ti.hostname or None,
            }
            for ti in session.query(af.TaskInstance)
        ]


def busy(af: sa.AF, ignore: tuple[str, ...] = ("etl", "hourly_etl")) -> list[str]:
    from airflow.models.asset import AssetDagRunQueue

    with af.create_session() as session:
        runs = [
            f"{dr.dag_id}/{dr.run_id}:{dr.state}"
            for dr in session.query(af.DagRun).filter(af.DagRun.state.in_(["queued", "running"]))
            if dr.dag_id not in ignore
        ]
        rows = [f"adrq:{q.target_dag_id}" for q in session.query(AssetDagRunQueue)]
    return runs + rows


def manual_event(af: sa.AF, day: Day, producer: str) -> None:
    """A manual run of a producer DAG; its task reports success with its outlet (an asset event) at a tick."""
    af.trigger(producer)
    day.count("manual_run")


class Rest:
    """Airflow's public REST API, served in this process by its own app (``create_app(apps="core")``, FastAPI's
    test client, no socket) with an admin's token from the auth manager: requests go through the real routes,
    their dependencies and the ``action_logging`` that writes the ``log`` rows (``patch_dag``), as from the UI."""

    def __init__(self) -> None:
        from airflow.api_fastapi.app import create_app, get_auth_manager
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from fastapi.testclient import TestClient

        app = create_app(apps="core")
        token = get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="admin", role="admin"))
        self.client = TestClient(app, headers={"Authorization": f"Bearer {token}"})

    def call(self, method: str, path: str, body: dict[str, Any]) -> Any:
        response = self.client.request(method, f"/api/v2{path}", json=body)
        ss.check(response.status_code == 200, f"{method} {path}: {response.status_code} {response.text}")
        return response.json()

    def pause(self, dag_id: str, paused: bool) -> None:
        self.call("PATCH", f"/dags/{dag_id}", {"is_paused": paused})  # what the UI's toggle sends

    def event(self, af: sa.AF, asset: str, extra: dict[str, Any]) -> int:
        from airflow.models.asset import AssetModel
        from sqlalchemy import select

        with af.create_session() as session:
            asset_id = session.scalar(select(AssetModel.id).where(AssetModel.name == asset))
        return int(self.call("POST", "/assets/events", {"asset_id": asset_id, "extra": extra})["id"])

    def clear_run(self, dag_id: str, run_id: str) -> None:
        body = {"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True}
        self.call("POST", f"/dags/{dag_id}/clearTaskInstances", body)

    def trigger(self, dag_id: str) -> str:
        return str(self.call("POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None})["dag_run_id"])


def pause_log(af: sa.AF) -> list[dict[str, Any]]:
    """The pause and unpause records Airflow's CLI and REST API wrote to ``log``."""
    from airflow.models.log import Log

    with af.create_session() as session:
        rows = session.query(Log).filter(Log.event.in_(["cli_dag_pause", "cli_dag_unpause", "patch_dag"]))
        return [
            {"event": r.event, "dag_id": r.dag_id, "dttm": r.dttm.isoformat(), "extra": r.extra, "owner": r.owner}
            for r in rows.order_by(Log.id)
        ]


def trigger_ids(af: sa.AF) -> set[int]:
    from airflow.models.trigger import Trigger
    from sqlalchemy import select

    with af.create_session() as session:
        return set(session.scalars(select(Trigger.id)))


def watcher_triggers(af: sa.AF) -> dict[str, int]:
    """The asset triggers the DAG parse created, by the queue file each reads."""
    from airflow.models.trigger import Trigger
    from sqlalchemy import select

    with af.create_session() as session:
        rows = session.scalars(select(Trigger).where(Trigger.classpath.like("queue_triggers.%"))).all()
        return {str(row.kwargs["path"]): int(row.id) for row in rows}


def copies_of_one_message(
    day: Day, trigger_id: int, queue: Path, message: dict[str, Any], again: dict[str, Any], consumer: str
) -> dict[str, Any]:
    """Both triggerers claim the watcher (3.1: each re-claims it from the other, alive, owner) and run it; a's
    copy submits the message, a tick makes the consumer's run, b's copy submits it again, a tick makes a
    second run."""
    af = day.af
    owned = {}
    for t in day.triggerers:
        st.heartbeat(t)
        owned[t.hostname] = day.load_triggers(t)
    queue.write_text(json.dumps(message))
    before = {r["run_id"] for r in af.runs(consumer)}
    first = ste.deliver(owned["triggerer-a"], trigger_id)
    day.tick()
    queue.write_text(json.dumps(again))
    second = ste.deliver(owned["triggerer-b"], trigger_id)
    day.tick()
    runs = [r for r in af.runs(consumer) if r["run_id"] not in before]
    if second is None:  # 3.2.2+: triggerer-b's loop did not get the trigger (the alive-owner filter)
        ss.check(first is not None and len(runs) == 1, f"one copy, one run: {first} {runs} {owned}")
        return None
    ss.check(first is not None, f"both copies submitted: {first} {second} {owned}")
    ss.check(len(runs) == 2 and [r["event_ids"] for r in runs] == [[first], [second]], f"one run per copy: {runs}")
    return {
        "dag_id": consumer,
        "run_ids": [r["run_id"] for r in runs],
        "first_run_id": runs[0]["run_id"],
        "extra_run_ids": [runs[1]["run_id"]],
        "shared_event_ids": [first, second],
        "run_after": runs[0]["run_after"],
        "creating_job_ids": [r["creating_job_id"] for r in runs],
        "ids_for_triggerer": owned,
    }


# -- the day ----------------------------------------------------------------------------------------------


def the_day(af: sa.AF) -> tuple[dict[str, Any], dict[int, set[int]]]:
    day = Day(af)
    truth: dict[str, Any] = {}
    triggers = watcher_triggers(af)
    ss.check(set(triggers) == {str(PAYMENTS_QUEUE), str(CLICKS_QUEUE)}, f"watcher triggers: {triggers}")
    for t in day.triggerers:
        st.heartbeat(t)
        day.load_triggers(t)

    # 00:00 - quiet: the catch-up DAG is paused (a maintenance window); the double bump is planted first, so no
    # scheduler has stopped before it (an orphan reset could not have made it).
    ss.cli("dags", "pause", "hourly_etl")
    truth["expected_bumps"], truth["bump_before"] = [], []
    if _version() < (3, 2):  # fixed in 3.2.0 (apache/airflow PR #60330): there is nothing to plant
        a, b = day.schedulers
        bumps = sdb.bumped(af, a, b)
        ss.check(len(bumps) == 1, f"one double bump: {bumps}")
        truth["expected_bumps"] = bumps
        truth["bump_before"] = list(sdb.BEFORE)
        day.note("planted double bump", ti_id=bumps[0]["ti_id"])
        for r in sdb.ti_rows(af):  # both attempts end before the first deploy (an orphan check would reset them)
            report(af, r["id"], {"dag_id": "etl", "task_id": "load"}, "success")
    ss.cli("dags", "unpause", "hourly_etl")
    PARTNER_FILE.write_text("ok")

    # Morning: the hourly catch-up, manual producer runs, customers events from hourly_etl's publish.
    for i in range(6):
        day.fire_triggers()
        day.tick(2)
        if i % 2 == 0:
            manual_event(af, day, "orders_producer")
    af.backfill("daily_report", _utcnow() - timedelta(days=4), _utcnow() - timedelta(days=2))
    day.note("backfill daily_report")
    day.tick(2)
    day.deploy_scheduler(0)  # rolling deploy, first pod
    for i in range(4):
        day.fire_triggers()
        day.tick(2)
        if i == 1:
            day.rest.event(af, "orders", {"source": "ops", "reason": "late file"})
            day.count("rest_event")
    day.deploy_scheduler(1)  # rolling deploy, second pod
    day.drain()

    # Midday: the asset race, with every DAG settled (scheduler-b held after its unlocked queue read).
    manual_event(af, day, "orders_producer")
    day.tick()  # the producer's task starts
    day.work()  # ... and reports success: its orders event queues orders_consumer and orders_or_customers
    a, b = day.schedulers
    before = max(r["id"] for r in af.runs())
    sa.race(af, a, b)
    groups = race_groups(af, int(a.job.id), int(b.job.id), before)
    # 3.2+ lock the queue rows (scheduler-b's locked re-read finds nothing): the clean fixture.
    ss.check(bool(groups) == (_version() < (3, 2)), f"the race made duplicates on 3.0/3.1 only: {af.runs()[-4:]}")
    truth["expected_groups"] = groups
    day.note("planted asset race", groups=len(groups))
    day.drain()

    # Afternoon: pause/unpause of a consumer with events meanwhile, a clear, a triggerer deploy, watchers.
    ss.cli("dags", "pause", "orders_consumer")
    manual_event(af, day, "orders_producer")
    day.tick(2)
    ss.cli("dags", "unpause", "orders_consumer")
    day.tick(2)
    done = [r for r in af.runs("orders_consumer") if r["run_type"] == "asset_triggered"]
    with af.create_session() as session:
        tis = session.query(af.TaskInstance).filter_by(dag_id="orders_consumer", run_id=done[0]["run_id"]).all()
        af.clear_task_instances(tis, session)
    day.note("cleared", run_id=done[0]["run_id"])
    day.rest.clear_run("orders_or_customers", af.runs("orders_or_customers")[1]["run_id"])  # the UI's "Clear"
    day.rest.trigger("orders_consumer")  # a manual run of an asset-scheduled DAG, from the UI
    day.count("rest_call", 2)
    manual_event(af, day, "orders_producer")
    day.drain()
    day.deploy_triggerer(1)
    # A missed deadline of a manual late_report run (Deadline.handle_miss, as the scheduler loop calls it): its
    # callback trigger has no alive-owner filter through 3.3.2, so both triggerers' loops claim it.
    known = trigger_ids(af)
    st.make_callback_trigger()
    callbacks = sorted(trigger_ids(af) - known)
    ss.check(len(callbacks) == 1, f"one callback trigger: {callbacks}")
    day.note("deadline missed", trigger_id=callbacks[0])
    for t in day.triggerers:
        st.heartbeat(t)
        day.load_triggers(t)
    day.crash_scheduler(1)
    day.drain()

    payments = triggers[str(PAYMENTS_QUEUE)]
    clicks = triggers[str(CLICKS_QUEUE)]
    mid = "5fea7756-0ea4-451a-a703-a558b933e274"
    group = copies_of_one_message(
        day,
        payments,
        PAYMENTS_QUEUE,
        ste.sqs_message(mid, "AQEBwJnKyrHigUMZj6rYigCgxlaS3SLy0a-1"),
        ste.sqs_message(mid, "AQEBkX3vN8pLq2Ty5Rw-2"),  # the same message received again
        "payments_consumer",
    )
    if group is not None:
        truth["expected_groups"].append({**group, "kind": "trigger_event", "confidence": "confirmed"})
    day.drain()
    # Look-alike: an operator posts an event with the message's extra through the REST API (Airflow adds
    # from_rest_api); one more run.
    last = max(e for r in af.runs("payments_consumer") for e in r["event_ids"])
    day.rest.event(af, "payments", ste.event_extra(int(last)))
    day.count("rest_event")
    day.drain()
    # Look-alike: a second, different SQS message with an equal body (its own MessageId), one run.
    other = ste.sqs_message("9b1c8f4e-2f0a-4c55-8d7e-0e6b1d9a7c31", "AQEBzT0pQm4n7Vx2L9sR-2")
    PAYMENTS_QUEUE.write_text(json.dumps(other))
    owned_a = day.load_triggers(day.triggerers[0])
    ss.check(ste.deliver(owned_a, payments) is not None, "the second message was submitted")
    day.drain()
    redis = {"channel": "clicks", "data": '{"click": 7}'}
    copies = copies_of_one_message(day, clicks, CLICKS_QUEUE, redis, redis, "clicks_consumer")
    truth["suspected_copies"] = [] if copies is None else [copies]
    day.drain()

    # Evening: more hourly runs and producer runs, then the day settles.
    for i in range(4):
        day.fire_triggers()
        day.tick(2)
        if i == 0:
            manual_event(af, day, "orders_producer")
    day.deploy_scheduler(0)
    # Maintenance of shipments_consumer through the UI: its event queued it; paused (PATCH, a patch_dag log row)
    # before the scheduler made the run; two events arrive meanwhile (no queue row: Airflow queues nothing for a
    # paused DAG); unpaused; the run of the row queued before the pause consumes the first event only, and no
    # shipments event comes later that day. Not stranded: the log says the two came while it was paused.
    manual_event(af, day, "shipments_producer")
    day.tick()  # the producer's task starts
    day.work()  # ... and succeeds: its event queues shipments_consumer
    day.rest.pause("shipments_consumer", True)
    paused = [day.rest.event(af, "shipments", {"batch": n}) for n in (1, 2)]
    day.rest.pause("shipments_consumer", False)
    day.count("rest_call", 4)
    day.drain()
    ship = af.runs("shipments_consumer")
    ss.check(len(ship) == 1 and not set(paused) & set(ship[0]["event_ids"]), f"paused events unconsumed: {ship}")
    truth["events_while_paused"] = [{"dag_id": "shipments_consumer", "event_ids": paused, "log": pause_log(af)}]
    # Night: the catch-up DAG is paused again; one last orders event makes the consumers' last runs, which take
    # every event an earlier run left behind (two events in one loop strand the second until the next one,
    # apache/airflow#56050: the day has them, and this absorbs them, so only the planted pair stays stranded).
    ss.cli("dags", "pause", "hourly_etl")
    day.drain()
    manual_event(af, day, "orders_producer")
    day.drain()

    # Late: an event committed after the run whose window held it (a producer's transaction held before its queue
    # insert while another event was committed and its run made), on a consumer that gets no later event.
    runner = day.schedulers[0]
    af.emit("refunds_producer", "refunds")
    af.create_runs(runner)  # an ordinary earlier run
    time.sleep(0.05)
    finish = ss.held_emit(af, "refunds_producer", "refunds", before_queue=True)
    time.sleep(0.05)
    e2 = af.emit("refunds_producer", "refunds")
    af.create_runs(runner)  # the run: the held event is in its window by timestamp, not committed yet
    late_event = finish()
    af.create_runs(runner)  # the held event's own row: a run whose window starts after it, consuming nothing
    ref = af.runs("refunds_consumer")
    ss.check(len(ref) == 3 and ref[1]["event_ids"] == [e2] and ref[2]["event_ids"] == [], f"{ref}")
    truth["expected_committed_late"] = [
        {"dag_id": "refunds_consumer", "event_ids": [late_event], "window_run_id": ref[1]["run_id"]}
    ]
    day.note("planted committed late", event=late_event)

    # Late: the stranded pair, on a consumer that gets no later event (scheduler-a held in its run creation).
    e1 = af.emit("inventory_producer", "inventory")
    late: list[int] = []
    runner = day.schedulers[0]
    ss.held_creation(af, runner, lambda: late.extend(af.emit("inventory_producer", "inventory") for _ in range(2)))
    sdb.scheduler_loop(af, runner)  # the next loop: nothing queued for them
    inv = af.runs("inventory_consumer")
    ss.check(len(inv) == 1 and inv[0]["event_ids"] == [e1], f"the held run consumed e1 only: {inv}")
    truth["expected_stranded"] = [
        {"dag_id": "inventory_consumer", "event_ids": sorted(late), "stranding_run_id": inv[0]["run_id"]}
    ]
    day.note("planted stranded", events=late)
    truth["notes"] = {
        "orphan_timing": {
            "health_check_threshold_s": HEALTH_CHECK_THRESHOLD_S,
            "check_interval_s": ORPHAN_CHECK_INTERVAL_S,
        },
        "deploys": day.deploys,
        "orphan_resets": day.resets,
        "timeline": day.timeline,
        "worker_outcomes": day.counts,
    }
    truth["notes"]["callback_trigger_ids"] = callbacks
    return truth, day.claims


def race_groups(af: sa.AF, first_job: int, dup_job: int, after_id: int) -> list[dict[str, Any]]:
    """Per DAG, the asset run scheduler-a made and the one scheduler-b made again (what Airflow recorded)."""
    made = [r for r in af.runs() if r["id"] > after_id and r["run_type"] == "asset_triggered"]
    dags = sorted({r["dag_id"] for r in made if r["creating_job_id"] == dup_job})
    return sa.duplicate_groups(af, dags, first_job, dup_job, after_id)


def exposures(af: sa.AF, claims: dict[int, set[int]], callbacks: list[int]) -> list[dict[str, Any]]:
    """Every watcher or deadline-callback trigger that two triggerer jobs' loops returned (3.1 lacks the
    alive-owner filter for both; 3.2.2+ has it for asset triggers only), with the triggerer jobs (Airflow's job
    rows). Task triggers (deferrals) are not of the kind: Airflow filters them in every version."""
    from airflow.jobs.job import Job
    from airflow.models.trigger import Trigger
    from sqlalchemy import select

    with af.create_session() as session:
        jobs = [
            {
                "id": j.id,
                "hostname": j.hostname,
                "start_date": j.start_date.isoformat(),
                "end_date": j.end_date.isoformat() if j.end_date else None,
                "latest_heartbeat": j.latest_heartbeat.isoformat() if j.latest_heartbeat else None,
            }
            for j in session.scalars(select(Job).where(Job.job_type == "TriggererJob").order_by(Job.id))
        ]
        triggers = [
            {"trigger_id": t.id, "created_date": t.created_date.isoformat(), "classpath": t.classpath}
            for t in session.scalars(select(Trigger).order_by(Trigger.id))
            if (t.classpath.startswith("queue_triggers.") or t.id in callbacks) and len(claims.get(t.id, set())) >= 2
        ]
    return [{**t, "triggerer_jobs": jobs} for t in triggers]


def leftovers(af: sa.AF, truth: dict[str, Any]) -> dict[str, Any]:
    """What the day left besides the planted ones, read from Airflow's rows (the generator's own checks)."""
    from airflow.models.asset import AssetEvent
    from sqlalchemy import select

    with af.create_session() as session:
        events = session.scalars(select(AssetEvent.id)).all()
    consumed = {e for r in af.runs() for e in r["event_ids"]}
    planted = {e for s in truth["expected_stranded"] + truth["expected_committed_late"] for e in s["event_ids"]}
    planted |= {e for s in truth["events_while_paused"] for e in s["event_ids"]}  # registered while paused
    unconsumed = sorted(set(events) - consumed - planted)
    tis = all_tis(af)
    bumped = {b["ti_id"] for b in truth["expected_bumps"]}
    reset = {r["ti_id"] for r in truth["notes"]["orphan_resets"]}
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH

    with af.create_session() as session:
        hist = {(h.dag_id, h.task_id, h.run_id, h.map_index, h.try_number) for h in session.query(TIH)}

    def lacks_history(t: dict[str, Any]) -> bool:
        key = (t["dag_id"], t["task_id"], t["run_id"], t["map_index"])
        return any((*key, k) not in hist for k in range(1, t["try_number"]))

    no_history = [t for t in tis if t["try_number"] >= 2 and t["id"] not in bumped and lacks_history(t)]
    unexplained = [t for t in no_history if t["id"] not in reset]
    ss.check(not unexplained, f"a try above 1 without history that no orphan check reset: {unexplained}")
    ss.check(not unconsumed, f"events consumed by no run besides the planted ones: {unconsumed}")
    return {"unconsumed_events": unconsumed, "tries_without_history_reset": [t["id"] for t in no_history]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=["busy_day"])
    ap.add_argument("--out-json", required=True)
    args = ap.parse_args()
    t0 = time.monotonic()
    folder = Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER") or HOME / "dags")
    folder.mkdir(parents=True, exist_ok=True)
    start = (_utcnow() - timedelta(days=1)).replace(minute=0, second=0, microsecond=0, tzinfo=None)
    src = DAGS.format(start=start.isoformat(), payments=PAYMENTS_QUEUE, clicks=CLICKS_QUEUE, partner=PARTNER_FILE)
    (folder / "busy_day.py").write_text(textwrap.dedent(src))
    for q in (PAYMENTS_QUEUE, CLICKS_QUEUE):
        q.write_text("{}")
    af = sa.AF()
    if _version() >= (3, 2):  # as scenarios_triggers.write_dags: the DAG processor's path creates the watchers
        import scenarios_partitioned as sp

        sp.serialize_dags()
        with af.create_session() as session:
            for dm in session.query(af.DagModel):
                dm.is_paused = False
    else:
        af.sync_dags(folder)
    if not watcher_triggers(af):  # 3.0: the first parse computes trigger references before the asset is active
        af.sync_dags(folder)
    truth, claims = the_day(af)
    truth["expected_exposures"] = exposures(af, claims, truth["notes"]["callback_trigger_ids"])
    truth["notes"]["claims"] = {str(k): sorted(v) for k, v in sorted(claims.items())}
    truth["leftovers"] = leftovers(af, truth)
    runs = af.runs()
    doc = {
        "scenario": args.scenario,
        "airflow_version": af.version,
        "description": __doc__.split("\n\n")[1].replace("\n", " "),
        **truth,
        "all_run_ids": [r["run_id"] for r in runs],
        "runs": runs,
        "generator": "scripts/airflow/scenarios_busy_day.py",
        "generator_seconds": round(time.monotonic() - t0, 1),
    }
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(
        f"busy_day: {len(runs)} runs, {doc['generator_seconds']} s, {truth['notes']['worker_outcomes']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

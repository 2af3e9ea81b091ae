"""Trigger-ownership scenarios made by Airflow's own code (3.0.6-3.3.2): the trigger_flapping check.

Why: up to 3.2.1 ``Trigger.get_sorted_triggers`` selects asset (AssetWatcher) triggers without the
"owner is not an alive triggerer" filter, and callback triggers lack it through 3.3.2
(docs/explanation/airflow-internals.md, "Triggers claimed by every triggerer"). So every triggerer's ``load_triggers``
re-claims them: the
``trigger.triggerer_id`` flips from one live triggerer to the other. Airflow keeps no history of
owners, so each scenario records the rows after every step (``samples``) and dumps the database at
each step (``<scenario>.<n>.sql``), for dupguard's live check to be replayed on them.

Every row is written by Airflow itself:

* DAG files parsed and stored by Airflow's DAG-processing code (``scenarios_asset.AF.sync_dags`` on
  3.0/3.1, ``scenarios_partitioned.serialize_dags`` on 3.2+); that code creates the asset trigger
  (``add_asset_trigger_references``) and its ``asset_trigger`` (3.0/3.1) / ``asset_watcher`` (3.2+) row.
* Triggerers: ``Job`` + ``TriggererJobRunner`` + ``Job.prepare_for_execution`` (what ``run_job``
  does), heartbeats with ``Job.heartbeat``, a triggerer that stops with ``Job.complete_execution``.
* One triggerer loop's database part = what ``TriggerRunnerSupervisor.load_triggers`` does:
  ``Trigger.assign_unassigned(job.id, capacity, health_check_threshold)`` then
  ``Trigger.ids_for_triggerer(job.id)`` (the ids the triggerer then runs); the subprocess that would
  run the trigger is not started.
* A callback trigger (3.1.2, 3.2.2, 3.3.2): ``Deadline(...)`` for a run made by ``trigger_dag``, committed, then
  read back by the scheduler loop's query and ``Deadline.handle_miss`` (what the scheduler calls for a
  missed deadline), which creates the ``callback`` row and its trigger.

The ground truth is what Airflow did: which triggerer's ``ids_for_triggerer`` returned the trigger at
each step, and whether the previous owner was in Airflow's own alive set (the subquery of
``assign_unassigned``, evaluated just before the claim) when the owner changed.

Run with an Airflow venv's python inside ``af.sh`` (``scripts/airflow/regen_triggers.sh`` does it all)::

    scripts/airflow/af.sh 3.1.2 postgresql://.../db python scripts/airflow/scenarios_triggers.py \\
        --scenario flip_asset --out-dir tests/fixtures/scenarios/3.1.2/triggers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

# Airflow reads these at import. A 3 s health-check threshold lets the stale-owner look-alike wait
# for it without sleeping Airflow's default 30 s; heartbeats every 1 s keep the live triggerers fresh.
THRESHOLD_SECONDS = 3
os.environ["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] = "False"
os.environ["AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD"] = str(THRESHOLD_SECONDS)
os.environ["AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

WATCHER = "AssetWatcher(name='orders_watcher', trigger=FileDeleteTrigger(filepath='/data/orders.ready'))"
DAG_FILE = """\
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.triggers.file import FileDeleteTrigger
from airflow.sdk import DAG, Asset, AssetWatcher

orders = Asset(name="orders", uri="s3://warehouse/orders", watchers=[{watchers}])
for dag_id in ("orders_consumer", "orders_report"):
    with DAG(dag_id, schedule=[orders], catchup=False):
        EmptyOperator(task_id="load")
with DAG("late_report", schedule=None, catchup=False):
    EmptyOperator(task_id="report")
"""
CONSUMERS = ["orders_consumer", "orders_report"]

SCENARIOS = {
    "flip_asset": "Two alive triggerers, one AssetWatcher trigger: triggerer-a's loop, triggerer-b's, "
    "triggerer-a's again (each heartbeats first). Up to 3.2.1 each loop claims the trigger from the other, "
    "alive, owner (the flapping); 3.2.2+ leaves it with triggerer-a.",
    "flip_callback": "Two alive triggerers, one deadline-callback trigger (Deadline.handle_miss): the same "
    "three loops. No alive-owner filter for callback triggers through 3.3.2: the owner flips.",
    "stale_owner": "Look-alike: triggerer-a claims the trigger, then stops heartbeating for longer than "
    "triggerer_health_check_threshold; triggerer-b's loop takes the trigger over (a normal failover); "
    "then triggerer-a heartbeats again.",
    "ended_owner": "Look-alike: triggerer-a claims the trigger and ends (Job.complete_execution, its last "
    "heartbeat still fresh); triggerer-b's loop takes the trigger over.",
    "recreated": "Look-alike: triggerer-a claims the trigger; the watcher is removed from the DAG file "
    "(re-parse, Trigger.clean_unused deletes the trigger) and added back (a new trigger row); "
    "triggerer-b's loop claims the new trigger.",
}


def _airflow_version() -> tuple[int, ...]:
    import airflow

    return tuple(int(p) for p in airflow.__version__.split(".")[:3])


def write_dags(with_watcher: bool) -> None:
    folder = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    (folder / "orders_watched.py").write_text(DAG_FILE.format(watchers=WATCHER if with_watcher else ""))
    if _airflow_version() >= (3, 2):
        from scenarios_partitioned import check_unpaused, serialize_dags

        serialize_dags()
        check_unpaused(CONSUMERS)
    else:
        from scenarios_asset import AF

        AF().sync_dags(folder)
        if with_watcher and not _trigger_count():
            # 3.0.6: the first parse computes the watcher's trigger references before the asset is
            # active (``_find_active_assets``), so the DAG processor's next parse creates the trigger.
            AF().sync_dags(folder)


def _trigger_count() -> int:
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return int(session.scalar(select(func.count(Trigger.id))) or 0)


def new_triggerer(hostname: str) -> Any:
    from airflow.jobs.job import Job
    from airflow.jobs.triggerer_job_runner import TriggererJobRunner

    job = Job()
    TriggererJobRunner(job=job, capacity=1000)  # sets job_type = "TriggererJob"
    job.hostname = hostname
    job.prepare_for_execution()
    return job


def heartbeat(job: Any) -> None:
    """``Job.heartbeat`` (it sleeps up to the 1 s heartrate), then its new timestamp written at once.

    ``prepare_for_execution`` leaves the job transient, and ``heartbeat`` sets ``latest_heartbeat`` on
    it after its session merged it, so that value reaches the database only with the next heartbeat's
    merge: the merge here is that write, with Airflow's own timestamp, one beat early.
    """
    from airflow.utils.session import create_session

    job.heartbeat(heartbeat_callback=lambda session: None)
    with create_session() as session:
        session.merge(job)


def alive_ids() -> list[int]:
    """Airflow's own alive-triggerer subquery of ``assign_unassigned``, evaluated now."""
    import datetime

    from airflow.jobs.job import Job
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return sorted(
            session.scalars(
                select(Job.id).where(
                    Job.end_date.is_(None),
                    Job.latest_heartbeat > timezone.utcnow() - datetime.timedelta(seconds=THRESHOLD_SECONDS),
                    Job.job_type == "TriggererJob",
                )
            )
        )


def load_triggers(job: Any) -> list[int]:
    """The database part of one triggerer loop (``TriggerRunnerSupervisor.load_triggers``)."""
    from airflow.models.trigger import Trigger

    Trigger.assign_unassigned(job.id, 1000, THRESHOLD_SECONDS)
    return sorted(Trigger.ids_for_triggerer(job.id))


def make_callback_trigger() -> None:
    """A missed deadline of a manual run, handled by Airflow's ``Deadline.handle_miss`` (3.1+) on the row
    read back as the scheduler loop reads it (``_run_scheduler_loop``: 3.1.2 L1392-1400, 3.2.2 L1709-1718,
    3.3.2 L1832-1851; the lock 3.3.2 adds changes nothing for one scheduler). Read back, not the object
    just added: its ``id`` is then the ``uuid6.UUID`` of the column's default, and 3.2.2's ``handle_miss``
    puts ``self.id`` itself into the trigger's kwargs, which ``airflow.sdk.serde`` cannot serialize (it has
    a serializer for ``uuid.UUID`` only, the type SQLAlchemy returns for a loaded row); 3.3.2 puts
    ``str(self.id)``. 3.1 has no ``callback`` table: the deadline holds its serialized callback and
    ``handle_miss`` sets ``deadline.trigger_id``; an unhandled deadline is ``callback_state IS NULL``."""
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.models.deadline import Deadline
    from airflow.utils import timezone
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    v31 = _airflow_version() < (3, 2)
    if v31:
        from airflow.sdk.definitions.deadline import AsyncCallback
    else:
        from airflow.sdk import AsyncCallback
    with create_session() as session:
        run = trigger_dag(
            "late_report", triggered_by=DagRunTriggeredByType.REST_API, triggering_user_name="admin", session=session
        )
        session.flush()
        callback = AsyncCallback("asyncio.sleep", kwargs={"delay": 0})
        due = timezone.utcnow() - timedelta(seconds=1)
        extra = {} if v31 else {"deadline_alert_id": None, "dag_id": "late_report"}
        # committed at the block's end, as the run's creation commits it
        session.add(Deadline(deadline_time=due, callback=callback, dagrun_id=run.id, **extra))
    with create_session() as session:
        missed = select(Deadline).where(Deadline.deadline_time < timezone.utcnow())
        if v31:
            missed = missed.where(Deadline.callback_state.is_(None))
        else:
            missed = missed.where(~Deadline.missed)
            missed = missed.options(selectinload(Deadline.callback), selectinload(Deadline.dagrun))
        for row in session.scalars(missed):
            row.handle_miss(session)


def iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class Recorder:
    """The rows after each step, and a data-only dump of the database at that step."""

    def __init__(self, name: str, out_dir: Path) -> None:
        self.name, self.out_dir, self.samples = name, out_dir, []  # type: ignore[var-annotated]

    def sample(self, step: str, owners: dict[str, list[int]]) -> None:
        from airflow.utils.session import create_session
        from sqlalchemy import text

        with create_session() as session:
            db_now = session.execute(text("SELECT clock_timestamp()")).scalar_one()
            triggers = session.execute(text("SELECT id, triggerer_id, created_date FROM trigger ORDER BY id")).all()
            jobs = session.execute(
                text(
                    "SELECT id, hostname, state, start_date, end_date, latest_heartbeat FROM job "
                    "WHERE job_type = 'TriggererJob' ORDER BY id"
                )
            ).all()
        index = len(self.samples)
        self.samples.append(
            {
                "step": step,
                "fixture": f"triggers/{self.name}.{index}",
                "db_now": db_now.isoformat(),
                "ids_for_triggerer": owners,  # what each triggerer's load_triggers returned
                "triggers": [
                    {"id": t.id, "triggerer_id": t.triggerer_id, "created_date": iso(t.created_date)} for t in triggers
                ],
                "triggerer_jobs": [
                    {
                        "id": j.id,
                        "hostname": j.hostname,
                        "state": j.state,
                        "start_date": iso(j.start_date),
                        "end_date": iso(j.end_date),
                        "latest_heartbeat": iso(j.latest_heartbeat),
                    }
                    for j in jobs
                ],
            }
        )
        from scenarios_partitioned import dump_database

        url = os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].replace("postgresql+psycopg2://", "postgresql://", 1)
        dump_database(url, self.out_dir / f"{self.name}.{index}.sql")


def claim(rec: Recorder, job: Any, flips: list[dict[str, Any]], *, beat: bool = True) -> None:
    """One loop of ``job``; a change of owner is recorded with whether Airflow held the old owner alive."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session
    from sqlalchemy import select

    if beat:
        heartbeat(job)
    with create_session() as session:
        before = dict(session.execute(select(Trigger.id, Trigger.triggerer_id)).all())
    alive = alive_ids()
    ids = load_triggers(job)
    with create_session() as session:
        after = dict(session.execute(select(Trigger.id, Trigger.triggerer_id)).all())
    for trigger_id, owner in after.items():
        old = before.get(trigger_id)
        if old is not None and owner != old:
            flips.append(
                {
                    "trigger_id": trigger_id,
                    "from_job": old,
                    "to_job": owner,
                    "sample": len(rec.samples),
                    "old_owner_alive": old in alive,
                }
            )
    rec.sample(f"{job.hostname} load_triggers", {job.hostname: ids})


def run(name: str, rec: Recorder) -> dict[str, Any]:
    version = _airflow_version()
    write_dags(with_watcher=name != "flip_callback")
    if name == "flip_callback":
        if version < (3, 1):
            raise SystemExit("flip_callback needs deadline callbacks (3.1+)")
        make_callback_trigger()
    a, b = new_triggerer("triggerer-a"), new_triggerer("triggerer-b")
    flips: list[dict[str, Any]] = []
    claim(rec, a, flips)
    if name in ("flip_asset", "flip_callback"):
        claim(rec, b, flips)
        claim(rec, a, flips)
    elif name == "stale_owner":
        heartbeat(b)
        time.sleep(THRESHOLD_SECONDS + 0.5)  # a is silent; b heartbeats just before its loop
        claim(rec, b, flips)
        heartbeat(a)  # a comes back
        rec.sample("triggerer-a heartbeats again", {})
    elif name == "ended_owner":
        from airflow.utils.state import JobState

        a.state = JobState.SUCCESS  # what run_job sets when the runner returns
        a.complete_execution()
        claim(rec, b, flips)
    elif name == "recreated":
        from airflow.models.trigger import Trigger

        write_dags(with_watcher=False)
        Trigger.clean_unused()
        write_dags(with_watcher=True)
        rec.sample("watcher removed (trigger deleted) and added back", {})
        claim(rec, b, flips)
    return {"flips": flips}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    parser.add_argument("--out-dir", required=True, type=Path)
    args = parser.parse_args()
    import airflow

    args.out_dir.mkdir(parents=True, exist_ok=True)
    rec = Recorder(args.scenario, args.out_dir)
    result = run(args.scenario, rec)
    if not rec.samples[0]["triggers"]:
        raise SystemExit(f"{args.scenario}: Airflow created no trigger")
    truth = {
        "scenario": args.scenario,
        "airflow_version": airflow.__version__,
        "description": SCENARIOS[args.scenario],
        "health_check_threshold_seconds": THRESHOLD_SECONDS,
        "consumer_dag_ids": [] if args.scenario == "flip_callback" else CONSUMERS,
        # Owner changes while Airflow's own alive query held the previous owner alive: the flapping.
        "expected_flapping": [f for f in result["flips"] if f["old_owner_alive"]],
        "owner_changes": result["flips"],
        "samples": rec.samples,
        "generated_by": "scripts/airflow/scenarios_triggers.py",
    }
    (args.out_dir / f"{args.scenario}.json").write_text(json.dumps(truth, indent=2) + "\n")
    print(
        textwrap.shorten(
            f"{airflow.__version__} {args.scenario}: {len(rec.samples)} samples, owner changes {result['flips']}", 300
        )
    )


if __name__ == "__main__":
    main()

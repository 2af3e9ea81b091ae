"""Builds scenario fixtures of task attempts bumped twice (the double_bump check) with Airflow's OWN code.

Why: in 3.0.x/3.1.x ``DagRun.schedule_tis`` updates task instances by id with no state guard and
adds 1 to ``try_number`` (docs/explanation/airflow-internals.md, "Task attempts bumped twice"). A scheduler whose view
of a run went stale sends a task another scheduler already queued back to ``scheduled`` with try k+1: same TI id, no
``task_instance_history`` row for try k. dupguard must flag that and must NOT flag the look-alikes
(a retry, a clear, an orphan reset), so every row here is written by Airflow itself:

* DAG files are parsed and stored as in ``scenarios_asset.py`` (its ``AF`` helpers are reused).
* Runs are triggered with ``trigger_dag``; both schedulers are ``SchedulerJobRunner`` objects with
  their own ``Job`` row, each calling ``_do_scheduling`` (one scheduler loop: run creation, run
  scheduling in ``_schedule_all_dag_runs``, the critical section that queues TIs).
* The race: two running runs of one DAG. scheduler-a's ``_schedule_all_dag_runs`` meets ONE
  transient database error (an ``OperationalError`` raised by its first ``_schedule_dag_run`` call,
  nothing else changed). Airflow's ``@retry_db_transaction`` rolls back, which releases both runs'
  ``FOR UPDATE`` locks, and calls it again with the same ``dag_runs`` argument: a one-shot
  ``ScalarResult`` in 3.0.6-3.2.2, so the retry goes on with the run the failed call had not reached.
  In the retry, a reads that run's TIs (state None; sessions have ``autoflush=False``, so nothing is
  locked yet) and is held on a ``threading.Event`` at the entry of ``DagRun.schedule_tis``.
  scheduler-b then runs a whole loop: it locks both runs, schedules their TIs (try 1), commits and
  queues them. The workers start try 1. a resumes: its ``UPDATE ... WHERE id IN (...)`` sets try 2
  on 3.0.6/3.1.2; on 3.2.2 the state guard of apache/airflow PR #60330 makes it a no-op.
* The worker's start of an attempt (``ti_run`` in the execution API) is written on the ORM object
  (state running, hostname, pid, start_date), as ``scenarios_asset.py`` does for finished tasks.

The ground truth (``--out-json``) is recorded from the rows Airflow wrote, before and after a's
update (``before``: what a live check saw on its previous pass), never by a detector.

    scripts/airflow/af.sh 3.1.2 postgresql://.../db python scripts/airflow/scenarios_double_bump.py \
        --scenario double_bump --out-json tests/fixtures/scenarios/3.1.2/double_bump.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import threading
import time
import types
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scenarios_asset import AF  # the shared Airflow helpers (sets Airflow's env first)

DAGS = """\
from datetime import datetime, timedelta

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

START = datetime(2026, 1, 1)

with DAG("etl", schedule=None, start_date=START, catchup=False, tags=["dupguard-fixture"]):
    BashOperator(task_id="load", bash_command="sleep 60", retries=2, retry_delay=timedelta(seconds=0))
"""

Body = Callable[[AF], list[dict[str, Any]]]
# The TI rows just before scheduler-a's stale update (what a live check's previous pass saw), per scenario.
BEFORE: list[dict[str, Any]] = []
NOTES: dict[str, Any] = {}  # what else a scenario recorded (written under "notes")


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _idle_workers(runner: Any) -> None:
    """Workloads the critical section sends stay in the executor (no worker picks them up; the
    workers' side is written by ``worker_starts``). 3.1+'s LocalExecutor does that unstarted; 3.0.6's
    ``queue_workload`` needs the ``activity_queue`` and worker processes ``start()`` makes."""
    for executor in getattr(runner.job, "executors", None) or runner.executors:  # 3.2+: on the runner
        if type(executor).__name__ == "LocalExecutor" and not hasattr(executor, "activity_queue"):
            executor.queue_workload = types.MethodType(_keep_workload, executor)  # bound: 3.0.6 reads __func__


def _keep_workload(executor: Any, workload: Any, session: Any = None) -> None:
    executor.queued_tasks[workload.ti.key] = workload  # what 3.1's BaseExecutor.queue_workload does


def scheduler_loop(af: AF, runner: Any) -> None:
    """One scheduler loop (``_do_scheduling``) in its own session, committed by Airflow."""
    _idle_workers(runner)
    session = af.settings.Session()
    try:
        runner._do_scheduling(session)
    finally:
        session.close()
        af.settings.Session.remove()


def ti_rows(af: AF, dag_id: str = "etl") -> list[dict[str, Any]]:
    with af.create_session() as session:
        out = []
        for ti in session.query(af.TaskInstance).filter_by(dag_id=dag_id).order_by(af.TaskInstance.run_id):
            out.append(
                {
                    "id": str(ti.id),
                    "dag_id": ti.dag_id,
                    "task_id": ti.task_id,
                    "run_id": ti.run_id,
                    "map_index": ti.map_index,
                    "try_number": ti.try_number,
                    "state": None
                    if ti.state is None
                    else str(ti.state.value if hasattr(ti.state, "value") else ti.state),
                    "hostname": ti.hostname or None,
                    "queued_by_job_id": ti.queued_by_job_id,
                }
            )
        return out


def history_tries(af: AF) -> list[dict[str, Any]]:
    from airflow.models.taskinstancehistory import TaskInstanceHistory as TIH

    with af.create_session() as session:
        return [
            {
                "task_instance_id": str(h.task_instance_id),
                "run_id": h.run_id,
                "task_id": h.task_id,
                "try_number": h.try_number,
            }
            for h in session.query(TIH).order_by(TIH.run_id, TIH.try_number)
        ]


def worker_starts(af: AF, run_id: str, host: str) -> None:
    """What the execution API's ``ti_run`` records when a worker starts the queued attempt."""
    with af.create_session() as session:
        ti = session.query(af.TaskInstance).filter_by(dag_id="etl", run_id=run_id).one()
        ti.state = af.TIState.RUNNING
        ti.hostname, ti.pid = host, 4242
        ti.start_date = ti.last_heartbeat_at = _utcnow()


def new_run(af: AF) -> str:
    run_id = af.trigger("etl")
    time.sleep(0.01)  # distinct logical dates for the next trigger
    return str(run_id)


def race(af: AF, sched_a: Any, sched_b: Any, before_resume: Callable[[], None] | None = None) -> dict[str, Any]:
    """a: one transient DB error, retry held at ``schedule_tis``; b: a whole loop; worker-1 starts;
    ``before_resume`` (if any); a resumes."""
    from sqlalchemy.exc import OperationalError

    a_held, b_done = threading.Event(), threading.Event()
    state: dict[str, Any] = {"failed": False, "held": False}
    errors: list[BaseException] = []
    orig_schedule_dag_run = sched_a._schedule_dag_run
    orig_schedule_tis = af.DagRun.schedule_tis

    def flaky_schedule_dag_run(dag_run: Any, session: Any) -> Any:
        if not state["failed"]:
            state["failed"] = True  # exactly one transient error, the first call only
            raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))
        return orig_schedule_dag_run(dag_run, session)

    def held_schedule_tis(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "scheduler-a" and not state["held"]:
            state["held"] = self.run_id
            a_held.set()
            if not b_done.wait(60):
                raise TimeoutError("scheduler-b did not finish")
        return orig_schedule_tis(self, *args, **kwargs)

    def run_a() -> None:
        try:
            scheduler_loop(af, sched_a)
        except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
            errors.append(e)
            a_held.set()

    sched_a._schedule_dag_run = flaky_schedule_dag_run
    af.DagRun.schedule_tis = held_schedule_tis  # type: ignore[method-assign]
    try:
        ta = threading.Thread(target=run_a, name="scheduler-a")
        ta.start()
        if not a_held.wait(60) or errors:
            raise errors[0] if errors else TimeoutError("scheduler-a never reached schedule_tis")
        scheduler_loop(af, sched_b)  # main thread: b locks the run a released, schedules and queues
        for r in ti_rows(af):
            worker_starts(af, r["run_id"], "worker-1")
        before = ti_rows(af)
        if before_resume is not None:
            before_resume()
        b_done.set()
        ta.join(60)
    finally:
        b_done.set()
        af.DagRun.schedule_tis = orig_schedule_tis  # type: ignore[method-assign]
        del sched_a._schedule_dag_run
    if errors:
        raise errors[0]
    if not (state["failed"] and state["held"]):
        raise RuntimeError("the transient error or the hold did not happen: no race")
    return {"before": before, "held_run_id": state["held"]}


def ground_truth(af: AF, before: list[dict[str, Any]], jobs: dict[str, int]) -> list[dict[str, Any]]:
    """Each TI whose id stayed and whose try went up by one while a worker ran it, with no history row."""
    after = {r["id"]: r for r in ti_rows(af)}
    hist = {(h["run_id"], h["task_id"], h["try_number"]) for h in history_tries(af)}
    out = []
    for b in before:
        a = after.get(b["id"])
        if a is None or a["try_number"] != b["try_number"] + 1:
            continue
        assert (b["run_id"], b["task_id"], b["try_number"]) not in hist, (b, hist)
        out.append(
            {
                "ti_id": b["id"],
                "dag_id": b["dag_id"],
                "task_id": b["task_id"],
                "run_id": b["run_id"],
                "map_index": b["map_index"],
                "tries": [b["try_number"], a["try_number"]],
                "before": b,
                "after": a,
                "scheduler_job_ids": jobs,
            }
        )
    return out


def _jobs(a: Any, b: Any) -> dict[str, int]:
    return {"scheduler-a": int(a.job.id), "scheduler-b": int(b.job.id)}


def bumped(af: AF, a: Any, b: Any, before_resume: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Two runs, the race, a's next loop and worker-2's start: the ground truth of the bump it made."""
    new_run(af), new_run(af)
    raced = race(af, a, b, before_resume)
    before, run_id = raced["before"], raced["held_run_id"]
    scheduler_loop(af, a)  # a's next loop queues what its stale update left scheduled (3.0/3.1)
    truth = ground_truth(af, before, _jobs(a, b))
    if truth:
        worker_starts(af, run_id, "worker-2")  # the second attempt starts; the first is still running
        truth[0]["after"] = next(r for r in ti_rows(af) if r["id"] == truth[0]["ti_id"])
        assert truth[0]["run_id"] == run_id, (truth, run_id)
    BEFORE[:] = before
    return truth


def sc_double_bump() -> tuple[str, Body]:
    def body(af: AF) -> list[dict[str, Any]]:
        return bumped(af, af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b"))

    return (
        "scheduler-a's _schedule_all_dag_runs met one transient DB error; Airflow's retry wrapper rolled "
        "back (releasing the run's row lock) and re-ran it. While a was past its TI read, scheduler-b ran a "
        "whole loop (scheduled try 1, queued it) and worker-1 started it; then a's unguarded schedule_tis "
        "set the same TI id to scheduled with try 2 (3.0.x/3.1.x), a queued it and worker-2 started it. "
        "3.2.x: a's update matched no row (the TI was running): try 1 stays, nothing to flag.",
        body,
    )


def _adopt_or_reset(af: AF, runner: Any) -> None:
    """One orphan check of ``runner`` (``adopt_or_reset_orphaned_tasks``), committed."""
    session = af.settings.Session()
    try:
        runner.adopt_or_reset_orphaned_tasks(session=session)
        session.commit()
    finally:
        session.close()
        af.settings.Session.remove()


def _heartbeat(af: AF, *runners: Any) -> None:
    """The write of ``Job.heartbeat`` (merge, ``latest_heartbeat`` = now, commit). Its ``session.merge(self)``
    then sets the attribute on ``self``, which persists only for a job attached to a session (a real
    scheduler's); ours are detached between steps, so the merged row gets it."""
    from airflow.utils import timezone

    for r in runners:
        with af.create_session() as session:
            session.merge(r.job).latest_heartbeat = timezone.utcnow()


def _job_row(af: AF, job_id: int) -> dict[str, Any]:
    with af.create_session() as session:
        j = session.get(af.Job, job_id)
        return {"id": j.id, "state": j.state, "latest_heartbeat": j.latest_heartbeat, "end_date": j.end_date}


def _scheduled_dttm(af: AF, ti_id: str) -> Any:
    with af.create_session() as session:
        return session.query(af.TaskInstance.scheduled_dttm).filter(af.TaskInstance.id == ti_id).scalar()


# The Airflow config of bump_after_stop (dupguard's double_bump settings must be given the same values).
STOP_THRESHOLD_S = 5
STOP_BEFORE_BUMP_S = 2.0


def sc_after_stop() -> tuple[str, Body]:
    def body(af: AF) -> list[dict[str, Any]]:
        os.environ["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD"] = str(STOP_THRESHOLD_S)
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        stopped: dict[str, Any] = {}

        def third_scheduler_stops() -> None:
            # scheduler-c (a third pod) heartbeats once and stops (killed: no end_date, state running).
            stopped["c"] = af.new_scheduler("scheduler-c")
            time.sleep(STOP_BEFORE_BUMP_S)

        truth = bumped(af, a, b, third_scheduler_stops)
        c = stopped["c"]
        time.sleep(STOP_THRESHOLD_S + 0.5)  # c's heartbeat is now older than the threshold
        _heartbeat(af, a, b)  # a and b are alive
        _adopt_or_reset(af, a)  # a's orphan check declares c dead (failed); nothing of c's to reset
        NOTES.update(
            stopped_job=_job_row(af, int(c.job.id)),
            health_check_threshold_s=STOP_THRESHOLD_S,
            bumped_scheduled_dttm=[_scheduled_dttm(af, t["ti_id"]) for t in truth],
        )
        return truth

    return (
        "The double_bump race (as in double_bump), and a third scheduler (scheduler-c) that heartbeat once "
        f"and stopped {STOP_BEFORE_BUMP_S:.0f} s before scheduler-a's stale update; "
        f"[scheduler] scheduler_health_check_threshold {STOP_THRESHOLD_S} s; after the bump a's orphan check "
        "declared c dead (failed). The bump came before c could be declared dead, so no orphan reset made "
        "it: a double bump (3.0.x/3.1.x).",
        body,
    )


def sc_retry() -> tuple[str, Body]:
    def body(af: AF) -> list[dict[str, Any]]:
        a = af.new_scheduler("scheduler-a")
        run_id = new_run(af)
        scheduler_loop(af, a)
        worker_starts(af, run_id, "worker-1")
        BEFORE[:] = ti_rows(af)
        with af.create_session() as session:
            ti = session.query(af.TaskInstance).filter_by(dag_id="etl", run_id=run_id).one()
            ti.task = af.SerializedDagModel.get_dag("etl", session=session).get_task("load")
            ti.handle_failure("exit code 1", session=session)  # retries=2: history row, new id, up_for_retry
        scheduler_loop(af, a)  # retry_delay 0: scheduled with try 2, queued
        worker_starts(af, run_id, "worker-2")
        return []

    return (
        "A real retry: try 1 failed on worker-1 (handle_failure: history row, new TI id), try 2 scheduled, "
        "queued and started on worker-2. Not a double bump.",
        body,
    )


def sc_cleared() -> tuple[str, Body]:
    def body(af: AF) -> list[dict[str, Any]]:
        a = af.new_scheduler("scheduler-a")
        run_id = new_run(af)
        scheduler_loop(af, a)
        worker_starts(af, run_id, "worker-1")
        BEFORE[:] = ti_rows(af)
        with af.create_session() as session:
            ti = session.query(af.TaskInstance).filter_by(dag_id="etl", run_id=run_id).one()
            af.finish_ti(ti, ti.start_date, _utcnow())  # try 1 succeeded on worker-1
        with af.create_session() as session:
            tis = session.query(af.TaskInstance).filter_by(dag_id="etl", run_id=run_id).all()
            af.clear_task_instances(tis, session)  # history row + new id, state None
        scheduler_loop(af, a)
        worker_starts(af, run_id, "worker-2")
        return []

    return (
        "A clear: try 1 succeeded on worker-1, clear_task_instances wrote the history row and gave a new id; "
        "try 2 scheduled and started on worker-2. Not a double bump.",
        body,
    )


def sc_orphan_reset() -> tuple[str, Body]:
    def body(af: AF) -> list[dict[str, Any]]:
        a, b = af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b")
        run_id = new_run(af)
        scheduler_loop(af, b)  # b schedules and queues try 1
        worker_starts(af, run_id, "worker-1")
        BEFORE[:] = ti_rows(af)
        os.environ["AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD"] = "1"
        time.sleep(1.5)  # b stops heartbeating (its pod froze); a keeps its heartbeat
        _heartbeat(af, a)
        _adopt_or_reset(af, a)  # b -> failed, the TI -> state None
        NOTES.update(health_check_threshold_s=1)
        scheduler_loop(af, a)  # same id, try 2, no history row: the double bump's shape
        worker_starts(af, run_id, "worker-2")
        return []

    return (
        "An orphan reset: scheduler-b queued try 1 (worker-1) and stopped heartbeating; scheduler-a's "
        "adopt_or_reset_orphaned_tasks marked b's job failed and set the TI back to None with no history "
        "row; a's next loop scheduled try 2 on the same id (worker-2). Told apart by b's job: failed, "
        "heartbeat stale. Not a double bump.",
        body,
    )


SCENARIOS: dict[str, Callable[[], tuple[str, Body]]] = {
    "double_bump": sc_double_bump,
    "bump_retry": sc_retry,
    "bump_cleared": sc_cleared,
    "bump_orphan_reset": sc_orphan_reset,
    "bump_after_stop": sc_after_stop,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    ap.add_argument("--out-json", required=True)
    args = ap.parse_args()

    description, body = SCENARIOS[args.scenario]()
    dags_folder = Path(os.environ.get("AIRFLOW__CORE__DAGS_FOLDER") or Path(os.environ["AIRFLOW_HOME"]) / "dags")
    dags_folder.mkdir(parents=True, exist_ok=True)
    (dags_folder / "fixture_dags.py").write_text(textwrap.dedent(DAGS))

    af = AF()
    af.sync_dags(dags_folder)
    expected = body(af)
    doc = {
        "scenario": args.scenario,
        "airflow_version": af.version,
        "description": description,
        "expected_bumps": expected,
        "before": BEFORE,
        "task_instances": ti_rows(af),
        "history": history_tries(af),
        "expected_groups": [],  # no duplicate runs: regen_scenarios.sh's run-pair cross-check expects none
        "all_run_ids": [r["run_id"] for r in af.runs()],
        "runs": af.runs(),
        "generator": "scripts/airflow/scenarios_double_bump.py",
        "notes": NOTES,
    }
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"{args.scenario}: {len(expected)} double bumps", file=sys.stderr)


if __name__ == "__main__":
    main()

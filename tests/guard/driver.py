"""Runs the guard inside a real Airflow and reports what Airflow did, as JSON (one scenario per process).

Run with an Airflow venv's python (``.airflow-venvs/<ver>/bin/python``); ``tests/guard/test_guard.py``
does that and asserts on the JSON. Runs are made only by Airflow's own scheduler code, reusing the
race generators of ``scripts/airflow/``: ``scenarios_asset`` (3.0/3.1: scheduler B held between its
unlocked queue read and the DagModel lock) and ``scenarios_partitioned`` (3.2: both schedulers read the
pending partition row before either creates a run).

How the guard gets in (``--mode``), set up before Airflow is imported, as a deployment would:

* ``none``: no policy at all;
* ``local-settings``: ``--local-settings FILE`` (the ``dupguard guard print-local-settings`` output)
  becomes ``$AIRFLOW_HOME/config/airflow_local_settings.py``, where the official chart mounts it;
* ``entry-point``: ``--site DIR`` holds the unpacked ``airflow-dupguard-guard`` wheel and goes first
  on sys.path; Airflow finds it through its ``airflow.policy`` entry point. No airflow_local_settings.

Scenarios ``broken-python`` / ``broken-sql`` replace one helper of the loaded guard so its body raises
(Python error) or its query fails in PostgreSQL (``SELECT 1/0``), to show run creation goes on
untouched. Several scenarios run in one process (one Airflow import), each on its own DAGs.

    .airflow-venvs/3.1.2/bin/python tests/guard/driver.py --scenarios race,ordinary --mode local-settings \\
        --local-settings /tmp/als.py --db-url postgresql://postgres@127.0.0.1:55432/db --out /tmp/r.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts" / "airflow"
GUARD_MODULES = ("airflow_local_settings", "dupguard_guard.policy")

ASSET_PREFIXES = (
    "orders", "brokenpy", "brokensql", "plain", "unlocked", "unlockedinv", "callback", "brokenfinish", "brokennote",
    "smallcache", "again", "metrics", "three",
)  # fmt: skip
# DAGs on two assets ("<p>_a" | "<p>_b"): the overlap race and its look-alike.
EITHER_PREFIXES = ("overlap", "disjoint", "late", "bounds")
# Second consumer DAGs: of the late event's asset (late-event), and of the race's asset with a later
# queue row of an asset of its own (second-consumer).
SECOND_CONSUMER_DAGS = """
with DAG("late_other", schedule=[late_b], start_date=START, catchup=False):
    EmptyOperator(task_id="extract")

shared = Asset(name="shared", uri="s3://warehouse/shared")
shared_extra = Asset(name="shared_extra", uri="s3://warehouse/shared_extra")

with DAG("shared_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[shared])

with DAG("shared_extra_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[shared_extra])

with DAG("shared_consumer", schedule=[shared], start_date=START, catchup=False):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")

with DAG("shared_other", schedule=(shared | shared_extra), start_date=START, catchup=False):
    EmptyOperator(task_id="extract")
"""
DAG_HEADER = """\
from datetime import datetime

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset

START = datetime(2026, 1, 1)

with DAG("daily_etl", schedule="@daily", start_date=START, catchup=False):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")
"""
ASSET_DAG = """
{p}_asset = Asset(name="{p}", uri="s3://warehouse/{p}")

with DAG("{p}_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[{p}_asset])

with DAG("{p}_consumer", schedule=[{p}_asset], start_date=START, catchup=False):
    extract = EmptyOperator(task_id="extract")
    fan = PythonOperator.partial(task_id="fan", python_callable=print).expand(op_args=[[1], [2], [3]])
    extract >> fan >> EmptyOperator(task_id="load")
"""


EITHER_DAG = """
{p}_a = Asset(name="{p}_a", uri="s3://warehouse/{p}_a")
{p}_b = Asset(name="{p}_b", uri="s3://warehouse/{p}_b")

with DAG("{p}_a_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[{p}_a])

with DAG("{p}_b_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[{p}_b])

with DAG("{p}_consumer", schedule=({p}_a | {p}_b), start_date=START, catchup=False):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")
"""
# DAGs on two assets whose runs see an empty event window: a producer transaction commits its queue
# row after a later run was made (sc_empty_window_race, sc_empty_window_lookalike).
EMPTY_WINDOW_PREFIXES = ("emptyrace", "emptylook")
# DAGs scheduled on an asset alias (3.1 consumes the alias's events too), their producer adding events
# through the aliases (``outlet_events[alias].add(asset)``, the assets made by Airflow on first use),
# and another DAG on another alias (paused by alias-overlap: the producer's events through it queue
# nothing).
ALIAS_DAG = """
from airflow.sdk import AssetAlias

aliasov_alias = AssetAlias(name="aliasov")
aliasov_other_alias = AssetAlias(name="aliasov_other")
aliasrace_alias = AssetAlias(name="aliasrace")

with DAG("aliasov_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[aliasov_alias, aliasov_other_alias, aliasrace_alias])

with DAG("aliasov_consumer", schedule=[aliasov_alias], start_date=START, catchup=False):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")

with DAG("aliasov_other_consumer", schedule=[aliasov_other_alias], start_date=START, catchup=False):
    EmptyOperator(task_id="extract")

with DAG("aliasrace_consumer", schedule=[aliasrace_alias], start_date=START, catchup=False):
    EmptyOperator(task_id="extract") >> EmptyOperator(task_id="load")
"""
# DAGs whose on_success_callback says a report was sent: the report DAG
# (``callback``), and the consumer without tasks (``notasks``; Airflow 3 accepts one).
REPORT_SENT = """

def report_sent(context):
    print("report sent")
"""
CALLBACK_DAG = """

{p}_asset = Asset(name="{p}", uri="s3://warehouse/{p}")

with DAG("{p}_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[{p}_asset])

{p}_consumer = DAG(
    "{p}_consumer",
    schedule=[{p}_asset],
    start_date=START,
    catchup=False,
    on_success_callback=report_sent,
    on_failure_callback=report_sent,
)
{tasks}"""
CALLBACK_TASKS = {"callback": 'with callback_consumer:\n    EmptyOperator(task_id="send_report")\n', "notasks": ""}
# A consumer whose task ``fan`` is mapped over its upstream's XCom: created unmapped (map index -1),
# expanded by the scheduler only once ``numbers`` succeeded (``TaskMap.expand_mapped_task``, which
# calls the hook for each new task instance), in a later scheduler session than the run's creation.
# Its pool does not exist, so the scheduler leaves the expanded ones scheduled (no executor here).
MAPPED_LATER_PREFIXES = ("mapped", "mappedcold")
MAPPED_LATER_DAG = """
{p}_asset = Asset(name="{p}", uri="s3://warehouse/{p}")

with DAG("{p}_producer", schedule=None, start_date=START, catchup=False):
    EmptyOperator(task_id="publish", outlets=[{p}_asset])

with DAG("{p}_consumer", schedule=[{p}_asset], start_date=START, catchup=False):
    numbers = PythonOperator(task_id="numbers", python_callable=lambda: [[1], [2], [3]])
    fan = PythonOperator.partial(task_id="fan", python_callable=print, pool="{p}_no_pool")
    fan.expand(op_args=numbers.output) >> EmptyOperator(task_id="load")
"""


def setup_environment(args: argparse.Namespace, home: Path) -> None:
    """Airflow's configuration for this process, before anything imports airflow."""
    (home / "dags").mkdir(parents=True)
    (home / "config").mkdir()
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": args.db_url.replace("postgresql://", "postgresql+psycopg2://", 1),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING": "False" if args.no_row_locking else "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        }
    )
    if args.mode == "local-settings":
        shutil.copyfile(args.local_settings, home / "config" / "airflow_local_settings.py")
    elif args.mode == "entry-point":
        sys.path.insert(0, str(args.site))
    # mode "installed": the guard is pip-installed in this very venv; nothing to set up.
    sys.path.insert(0, str(SCRIPTS))


def loaded_guard() -> Any:
    """The guard module Airflow loaded (None in mode none), after `import airflow`."""
    import importlib

    for name in GUARD_MODULES:
        module = sys.modules.get(name)
        if module is None and name == "dupguard_guard.policy":
            try:
                module = importlib.import_module(name)  # what Airflow's entry point loaded
            except ImportError:
                module = None
        if module is not None and hasattr(module, "_dupguard_guard"):
            return module
    return None


def policy_facts(guard: Any) -> dict[str, Any]:
    """How Airflow wired the policy in: hook implementations and the verify_integrity switch."""
    from airflow import settings

    manager = getattr(settings, "POLICY_PLUGIN_MANAGER", None)
    if manager is None:
        manager = settings.get_policy_plugin_manager()
    impls = manager.hook.task_instance_mutation_hook.get_hookimpls()
    return {
        "guard_module": guard.__name__ if guard else None,
        "hookimpls": [getattr(i.plugin, "__name__", type(i.plugin).__name__) for i in impls],
        "is_noop": bool(getattr(settings.task_instance_mutation_hook, "is_noop", False)),
    }


def local_settings_files() -> list[str]:
    """Every airflow_local_settings module Python could import here (Airflow imports the first one)."""
    import importlib.util

    spec = importlib.util.find_spec("airflow_local_settings")
    return [] if spec is None or spec.origin is None else [spec.origin]


def break_guard(guard: Any, how: str) -> None:
    """Make the guard's lookup fail: in Python, or in PostgreSQL inside the scheduler's transaction."""
    if how == "python":

        def boom(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("forced failure of the guard's query builder")

        guard._dupguard_guard.asset_statement = boom
        guard._dupguard_guard.partitioned_statement = boom
    elif how == "sql":
        from sqlalchemy import text

        def division_by_zero(*args: Any, **kwargs: Any) -> Any:
            return text("SELECT 1/0, false, false")

        guard._dupguard_guard.asset_statement = division_by_zero
        guard._dupguard_guard.partitioned_statement = division_by_zero


def _api_serialisable(dr: Any) -> bool | None:
    """Whether Airflow's REST API can show this run among an asset event's ``created_dagruns``: its
    ``DagRunAssetReference`` model requires a start_date (3.0.6-3.3.2, apache/airflow#71360), and
    one run that fails it makes every event it consumed unreadable. None where the model is absent."""
    try:
        from airflow.api_fastapi.core_api.datamodels.assets import DagRunAssetReference
    except ImportError:
        return None
    try:
        DagRunAssetReference.model_validate(dr, from_attributes=True)
    except Exception:  # noqa: BLE001 - pydantic's ValidationError: the API would answer 500
        return False
    return True


def run_rows(dag_id: str | None = None) -> list[dict[str, Any]]:
    """Every run (optionally of one DAG) with its task instances and note, read through Airflow's ORM."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    out = []
    with create_session() as session:
        query = session.query(DagRun)
        if dag_id:
            query = query.filter(DagRun.dag_id == dag_id)
        for dr in query.order_by(DagRun.id):
            tis = session.query(TaskInstance).filter_by(dag_id=dr.dag_id, run_id=dr.run_id).all()
            out.append(
                {
                    "id": dr.id,
                    "dag_id": dr.dag_id,
                    "run_id": dr.run_id,
                    "run_type": str(getattr(dr.run_type, "value", dr.run_type)),
                    "run_after": dr.run_after.isoformat(),
                    "partition_key": getattr(dr, "partition_key", None),
                    "creating_job_id": dr.creating_job_id,
                    "state": str(getattr(dr.state, "value", dr.state)),
                    "start_date": None if dr.start_date is None else dr.start_date.isoformat(),
                    "end_date": None if dr.end_date is None else dr.end_date.isoformat(),
                    "api_serialisable": _api_serialisable(dr),
                    "note": dr.note,
                    "event_ids": sorted(e.id for e in dr.consumed_asset_events),
                    "tis": sorted(
                        (
                            {
                                "task_id": ti.task_id,
                                "map_index": ti.map_index,
                                "state": None if ti.state is None else str(getattr(ti.state, "value", ti.state)),
                                "try_number": ti.try_number,
                            }
                            for ti in tis
                        ),
                        key=lambda t: (t["task_id"], t["map_index"]),
                    ),
                }
            )
    return out


def advisory_locks() -> int:
    """Advisory locks granted in this Airflow database now, read on a connection of its own (the
    guard's are transaction-scoped: a creator still in its transaction shows the ones it took)."""
    from airflow import settings
    from sqlalchemy import text

    sql = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    )
    with settings.engine.connect() as connection:
        return int(connection.execute(text(sql)).scalar())


def hold_a_before_the_lock(guard: Any, a_in_hook: threading.Event, b_locked: threading.Event) -> Any:
    """The inverted order: scheduler-a's guard is held right before it takes its lock until
    scheduler-b's guard has taken the same lock. Returns a function restoring the guard's method."""
    g = guard._dupguard_guard if guard is not None else None
    original = getattr(g, "take_lock", None)
    if original is None:
        return lambda: None

    def take_lock(*l_args: Any, **l_kwargs: Any) -> Any:
        name = threading.current_thread().name
        if name == "scheduler-a":
            a_in_hook.set()
            b_locked.wait(60)
        taken = original(*l_args, **l_kwargs)
        if name == "scheduler-b":
            b_locked.set()
        return taken

    g.take_lock = take_lock  # type: ignore[union-attr]
    return lambda: g.__dict__.pop("take_lock", None)


# Scenarios, 3.0/3.1 ------------------------------------------------------------------------------------


def race_once(ctx: Context, prefix: str) -> dict[str, Any]:
    """The deterministic two-scheduler race on one consumer DAG; then its duplicate is cleared by hand."""
    import scenarios_asset

    af, (a, b) = ctx.af, ctx.schedulers
    af.emit(f"{prefix}_producer", prefix)
    started = time.monotonic()
    scenarios_asset.race(af, a, b)
    out: dict[str, Any] = {"race_seconds": round(time.monotonic() - started, 3)}
    out["runs"] = run_rows(f"{prefix}_consumer")
    # An operator who clears the duplicate's task instances wants them to run: the guard leaves
    # existing task instances alone.
    duplicates = [r for r in out["runs"] if r["creating_job_id"] == b.job.id]
    if duplicates:
        with af.create_session() as session:
            tis = (
                session.query(af.TaskInstance)
                .filter_by(dag_id=f"{prefix}_consumer", run_id=duplicates[0]["run_id"])
                .all()
            )
            af.clear_task_instances(tis, session)
        out["after_clear"] = run_rows(f"{prefix}_consumer")
    return out


def sc_race(ctx: Context) -> dict[str, Any]:
    # The advisory locks held while each creator is still in its transaction (its run and task
    # instances made, the guard's decision taken): with row-level locking the guard takes none.
    cls = dag_run_class(ctx.af)
    original = cls.create_dagrun
    held: dict[str, int] = {}

    def create_dagrun(self: Any, *c_args: Any, **c_kwargs: Any) -> Any:
        run = original(self, *c_args, **c_kwargs)
        name = threading.current_thread().name
        if name.startswith("scheduler-"):  # not the producer runs made in the main thread
            held[name] = max(held.get(name, 0), advisory_locks())
        return run

    cls.create_dagrun = create_dagrun  # type: ignore[method-assign]
    try:
        out = race_once(ctx, "orders")
    finally:
        cls.create_dagrun = original  # type: ignore[method-assign]
    out["advisory_locks"] = held
    if ctx.guard is None:
        # Without the guard, an operator skips every task of the duplicate by hand (what "mark
        # skipped" in the UI does to each task instance): the daemon must not call that "prevented".
        af, (_, b) = ctx.af, ctx.schedulers
        dup = next(r for r in out["runs"] if r["creating_job_id"] == b.job.id)
        with af.create_session() as session:
            for ti in session.query(af.TaskInstance).filter_by(dag_id="orders_consumer", run_id=dup["run_id"]):
                ti.set_state(af.TIState.SKIPPED, session=session)
        out["hand_skipped"] = run_rows("orders_consumer")
    return out


def sc_race_again(ctx: Context) -> dict[str, Any]:
    """The race on a DAG that already had an asset run (made by a third scheduler): the events the
    new runs consume start after that run's run_after, so the earlier event is no part of the
    duplicate's check."""
    ctx.af.emit("again_producer", "again")
    ctx.af.create_runs(ctx.af.new_scheduler("scheduler-c"))
    return race_once(ctx, "again")


def sc_broken(ctx: Context, how: str, prefix: str) -> dict[str, Any]:
    """The race with the guard's lookup made to fail (Python error, or SQL error in the transaction)."""
    guard = ctx.guard._dupguard_guard
    break_guard(ctx.guard, how)
    logged_before = len(ctx.guard_logs)
    try:
        out = race_once(ctx, prefix)
    finally:
        for name in ("asset_statement", "partitioned_statement"):  # back to the real methods
            guard.__dict__.pop(name, None)
    out["guard_logs"] = ctx.guard_logs[logged_before:]
    return out


def sc_broken_finish(ctx: Context) -> dict[str, Any]:
    """Airflow's own ``DagRun.set_state`` raises while the guard finishes the duplicate,
    after it changed the run (the worst case: the state and end_date are already set)."""
    from airflow.models.dagrun import DagRun

    original = DagRun.set_state

    def failing(self: Any, state: Any) -> None:
        original(self, state)
        if self.dag_id == "brokenfinish_consumer" and str(getattr(state, "value", state)) == "success":
            raise RuntimeError("forced failure in DagRun.set_state")

    DagRun.set_state = failing
    try:
        out = race_failing(ctx, "brokenfinish")
    finally:
        DagRun.set_state = original
    return out


def race_failing(ctx: Context, prefix: str) -> dict[str, Any]:
    """The race, with the guard's error log let through once more (its 5-minute rate limit reset):
    the error logged is the one that made the guard fail."""
    ctx.guard._dupguard_guard._last_error_log = float("-inf")
    logged_before = len(ctx.guard_logs)
    out = race_once(ctx, prefix)
    out["guard_logs"] = ctx.guard_logs[logged_before:]
    return out


def sc_broken_note(ctx: Context) -> dict[str, Any]:
    """Adding the note raises after the guard finished the duplicate (its state and both dates set):
    the guard puts the run back, all or nothing, as when finishing raises."""
    guard = ctx.guard._dupguard_guard

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("forced failure while adding the note")

    guard.add_note = boom
    try:
        out = race_failing(ctx, "brokennote")
    finally:
        guard.__dict__.pop("add_note", None)
    return out


def sc_small_cache(ctx: Context) -> dict[str, Any]:
    """The race with the guard's decision cache holding no run (size 0, as when one transaction
    creates more runs than the cache holds): each task instance of a run is decided again in the
    same transaction, and the duplicate must still get one note (two would fail Airflow's flush)."""
    guard = ctx.guard._dupguard_guard
    saved, guard.cache_size = guard.cache_size, 0
    try:
        return race_once(ctx, "smallcache")
    finally:
        guard.cache_size = saved


def sc_metrics(ctx: Context) -> dict[str, Any]:
    """Airflow's own ``task_instance_created`` counters for one run of a DAG whose task
    ``fan`` is mapped over three literals (``DagRun.verify_integrity`` -> ``_create_task_instances``),
    recorded where dagrun.py hands them to ``Stats.incr``: per task while
    ``task_instance_mutation_hook.is_noop``, per task instance once a hook is registered."""
    import airflow.models.dagrun as dagrun_module

    stats = dagrun_module.Stats
    counted: dict[str, int] = {}

    class Recording:
        def __getattr__(self, name: str) -> Any:
            return getattr(stats, name)

        def incr(self, stat: str, count: int = 1, *args: Any, tags: Any = None, **kw: Any) -> Any:
            if stat == "task_instance_created":
                key = (tags or {}).get("task_type", "?")
                counted[key] = counted.get(key, 0) + count
            return stats.incr(stat, count, *args, tags=tags, **kw)

    dagrun_module.Stats = Recording()
    try:
        ctx.af.trigger("metrics_consumer")
    finally:
        dagrun_module.Stats = stats
    (run,) = run_rows("metrics_consumer")
    return {"task_instance_created": counted, "task_instances": len(run["tis"])}


def sc_notasks(ctx: Context) -> dict[str, Any]:
    """The race on a consumer DAG without tasks, then Airflow's own scheduling loop (as
    ``sc_callback``): the hook is called per task instance, so the guard never sees this run."""
    af, (a, b) = ctx.af, ctx.schedulers
    guard = ctx.guard._dupguard_guard if ctx.guard is not None else None
    queries_before = guard.queries if guard is not None else 0
    af.emit("notasks_producer", "notasks")
    scenarios_asset_race(af, a, b)
    out: dict[str, Any] = {
        "runs": run_rows("notasks_consumer"),
        "guard_calls": (guard.queries - queries_before) if guard is not None else None,
    }
    out["callbacks"] = schedule_only(ctx, "notasks_consumer")
    out["after_scheduling"] = run_rows("notasks_consumer")
    return out


def sc_mapped_later(ctx: Context, prefix: str) -> dict[str, Any]:
    """The race on a DAG whose task ``fan`` is mapped over ``numbers``' XCom; then an
    operator clears the guarded duplicate (it is to run), ``numbers`` succeeds in both runs, and
    Airflow's own scheduling loop (``schedule_only``) starts the duplicate and expands ``fan`` in
    both runs (``DagRun._get_ready_tis`` -> ``TaskMap.expand_mapped_task``): the hook is called for
    the new task instances in a scheduler session that is not the runs' creating transaction.

    ``mappedcold``: the decision cache is emptied first, as in the other HA scheduler's process (or
    after a restart), so the guard looks the runs up again, with their task instance rows there.
    Without the clear the duplicate would never expand: it is created finished, and the scheduler
    only examines running runs (``DagRun.get_running_dag_runs_to_examine``)."""
    from airflow.models.taskmap import TaskMap

    af, (a, b) = ctx.af, ctx.schedulers
    dag_id = f"{prefix}_consumer"
    af.emit(f"{prefix}_producer", prefix)
    scenarios_asset_race(af, a, b)
    out: dict[str, Any] = {"created": run_rows(dag_id)}
    (dup,) = [r for r in out["created"] if r["creating_job_id"] == b.job.id]
    with af.create_session() as session:
        tis = session.query(af.TaskInstance).filter_by(dag_id=dag_id, run_id=dup["run_id"]).all()
        af.clear_task_instances(tis, session)
    with af.create_session() as session:
        end = af_now()
        for run in out["created"]:
            ti = session.query(af.TaskInstance).filter_by(dag_id=dag_id, run_id=run["run_id"], task_id="numbers").one()
            af.finish_ti(ti, end - _seconds(1), end)
            # What Airflow's execution API records when the task pushes a value a downstream maps over.
            session.add(TaskMap.from_task_instance_xcom(ti, [[1], [2], [3]]))
    guard = ctx.guard._dupguard_guard if ctx.guard is not None else None
    if guard is not None:
        guard._last_error_log = float("-inf")  # a failure of the guard's below is logged (no rate limit)
        if prefix == "mappedcold":
            guard._decisions.clear()
    queries_before, logged_before = (guard.queries if guard is not None else 0), len(ctx.guard_logs)
    out["callbacks"] = schedule_only(ctx, dag_id)
    out["guard_calls"] = (guard.queries - queries_before) if guard is not None else None
    out["guard_logs"] = ctx.guard_logs[logged_before:]
    out["runs"] = run_rows(dag_id)
    return out


def sc_ordinary(ctx: Context) -> dict[str, Any]:
    """Runs the guard must not touch: scheduled, manual, successive asset runs (HA), a cleared run."""
    af, (a, b) = ctx.af, ctx.schedulers
    af.create_runs(a)  # the scheduled run of daily_etl
    af.trigger("daily_etl")
    af.trigger("plain_consumer")  # a manual run of the asset-scheduled DAG
    for i in range(3):  # successive asset runs, the two schedulers taking turns (no race)
        af.emit("plain_producer", "plain")
        af.create_runs(a if i % 2 == 0 else b)
        time.sleep(0.05)
    first_asset = next(r for r in run_rows("plain_consumer") if r["run_type"] == "asset_triggered")
    with af.create_session() as session:
        tis = session.query(af.TaskInstance).filter_by(dag_id="plain_consumer", run_id=first_asset["run_id"]).all()
        end = af_now()
        for ti in tis:
            af.finish_ti(ti, end - _seconds(2), end)
    with af.create_session() as session:
        tis = session.query(af.TaskInstance).filter_by(dag_id="plain_consumer", run_id=first_asset["run_id"]).all()
        af.clear_task_instances(tis, session)
    return {
        "cleared_run_id": first_asset["run_id"],
        "runs": run_rows("plain_consumer") + run_rows("daily_etl"),
    }


def hold_after_queue_read(af: Any, names: tuple[str, ...]) -> tuple[dict[str, threading.Event], Any]:
    """Pause the named scheduler threads once, right after their unlocked asset queue read.

    ``dags_needing_dagruns`` calls ``SerializedDagModel.get_latest_serialized_dags`` right after its
    ``SELECT asset_dag_run_queue`` (docs/explanation/airflow-internals.md, "The scheduler's run-creation step"); the
    thread sets ``<name>-read`` and waits for
    ``<name>-go``. Returns the events and a function restoring Airflow's method.
    """
    events = {f"{n}-{what}": threading.Event() for n in names for what in ("read", "go")}
    original = af.SerializedDagModel.get_latest_serialized_dags
    held: set[str] = set()

    def hold(cls: Any, *args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name
        if name in names and name not in held:
            held.add(name)
            events[f"{name}-read"].set()
            if not events[f"{name}-go"].wait(60):
                raise TimeoutError(f"{name} was never released")
        return original(*args, **kwargs)

    af.SerializedDagModel.get_latest_serialized_dags = classmethod(hold)  # type: ignore[method-assign]

    def restore() -> None:
        af.SerializedDagModel.get_latest_serialized_dags = original  # type: ignore[method-assign]

    return events, restore


def run_threads(af: Any, steps: Any, *runners: tuple[Any, str]) -> None:
    """Run ``create_runs`` of each (runner, name) in a thread of that name while ``steps()`` drives them."""
    errors: list[BaseException] = []

    def work(runner: Any) -> None:
        try:
            af.create_runs(runner)
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(r,), name=n) for r, n in runners]
    for t in threads:
        t.start()
    try:
        steps()
    finally:
        for t in threads:
            t.join(120)
    if errors:
        raise errors[0]


def sc_overlap(ctx: Context) -> dict[str, Any]:
    """The overlap race: two runs with different run_after, one shared event.

    B reads the queue when only asset a's row exists and is held; an event of asset b arrives; A reads
    (a + b), creates a run consuming both events and commits; B then creates a run from its older
    read: an earlier run_after, consuming the asset a event again.
    """
    af = ctx.af
    first = af.emit("overlap_a_producer", "overlap_a")
    second = overlap_race(ctx, lambda: af.emit("overlap_b_producer", "overlap_b"))
    return {"events": [first, second], "runs": run_rows("overlap_consumer")}


def overlap_race(ctx: Context, emit_second: Any) -> Any:
    """The overlap interleaving: B reads the queue and is held; ``emit_second()`` commits an event; A
    reads the queue, creates its run and commits; B then creates its run from its older read.
    Returns what ``emit_second`` returned."""
    af, (a, b) = ctx.af, ctx.schedulers
    events, restore = hold_after_queue_read(af, ("scheduler-b",))
    second: list[Any] = []

    def steps() -> None:
        if not events["scheduler-b-read"].wait(60):
            raise TimeoutError("scheduler-b never read the queue")
        second.append(emit_second())
        af.create_runs(a)  # A in this thread: reads both events' rows, creates its run and commits
        events["scheduler-b-go"].set()

    try:
        run_threads(af, steps, (b, "scheduler-b"))
    finally:
        restore()
    return second[0]


def stamp_at_queue_time(af: Any, event_id: int, dag_id: str) -> None:
    """Give an asset event the time of the queue row it made for ``dag_id`` (the run_after of the
    run it triggers): an event and its queue row written within one microsecond of Airflow's clock.
    Airflow's event window includes that bound (``timestamp <= run_after``) and the next run's window
    excludes it (``timestamp > previous run_after``)."""
    from airflow.models.asset import AssetDagRunQueue, AssetEvent

    with af.create_session() as session:
        event = session.get(AssetEvent, event_id)
        queued = session.query(AssetDagRunQueue).filter_by(asset_id=event.asset_id, target_dag_id=dag_id).one()
        event.timestamp = queued.created_at


def event_times(af: Any, event_ids: list[int]) -> dict[str, str]:
    """The recorded timestamp of each asset event, by id."""
    from airflow.models.asset import AssetEvent

    with af.create_session() as session:
        rows = session.query(AssetEvent).filter(AssetEvent.id.in_(event_ids))
        return {str(e.id): e.timestamp.isoformat() for e in rows}


class OnlyUnpaused:
    """Pause every DAG but ``dag_ids`` (the scheduler skips paused DAGs), so that one scheduler loop
    creates runs for those DAGs only; the DAGs paused here are unpaused on exit."""

    def __init__(self, af: Any, *dag_ids: str) -> None:
        self.af, self.dag_ids, self.paused = af, dag_ids, list[str]()

    def __enter__(self) -> None:
        dm = self.af.DagModel
        with self.af.create_session() as session:
            for model in session.query(dm).filter(dm.dag_id.not_in(self.dag_ids), dm.is_paused.is_(False)):
                model.is_paused = True
                self.paused.append(model.dag_id)

    def __exit__(self, *exc: object) -> None:
        dm = self.af.DagModel
        with self.af.create_session() as session:
            for model in session.query(dm).filter(dm.dag_id.in_(self.paused)):
                model.is_paused = False


def sc_bounds(ctx: Context) -> dict[str, Any]:
    """The event window's bounds at equality: a first asset run R0 whose event is timestamped exactly
    at R0's run_after (R0 consumes it; the next window starts after it), then the overlap race whose
    shared event is timestamped exactly at B's run_after (B's window includes it: B's run is the
    overlap duplicate of A's)."""
    af = ctx.af
    events = [af.emit("bounds_a_producer", "bounds_a")]
    stamp_at_queue_time(af, events[0], "bounds_consumer")
    af.create_runs(af.new_scheduler("scheduler-c"))
    events.append(af.emit("bounds_a_producer", "bounds_a"))
    stamp_at_queue_time(af, events[1], "bounds_consumer")
    events.append(overlap_race(ctx, lambda: af.emit("bounds_b_producer", "bounds_b")))
    return {"events": events, "event_times": event_times(af, events), "runs": run_rows("bounds_consumer")}


def hold_open_emit(af: Any, producer: str, asset: str, out: dict[str, Any], key: str) -> Any:
    """A producer whose transaction stays open after its asset event was written (a slow commit, a
    long transaction): the event has its timestamp (Airflow's clock at the flush) and its queue rows,
    but no other session sees them until it commits. ``af.emit`` in a thread of its own, held right
    after ``AssetManager.register_asset_change`` returned, until the returned function is called
    (which commits, stores the event id in ``out[key]`` and restores Airflow's method)."""
    flushed, release = threading.Event(), threading.Event()
    original = af.AssetManager.register_asset_change  # bound classmethod
    errors: list[BaseException] = []

    def register(cls: Any, *args: Any, **kwargs: Any) -> Any:
        event = original(*args, **kwargs)
        if threading.current_thread().name == "producer-held":
            flushed.set()
            if not release.wait(60):
                raise TimeoutError("the held producer was never released")
        return event

    def work() -> None:
        try:
            out[key] = af.emit(producer, asset)
        except BaseException as err:  # noqa: BLE001 - re-raised by the returned function
            errors.append(err)
            flushed.set()

    af.AssetManager.register_asset_change = classmethod(register)
    thread = threading.Thread(target=work, name="producer-held")
    thread.start()
    flushed.wait(60)

    def commit() -> None:
        release.set()
        thread.join(60)
        af.AssetManager.register_asset_change = original
        if errors:
            raise errors[0]

    return commit


def sc_late_event(ctx: Context) -> dict[str, Any]:
    """The 3.1 counterpart of partitioned-late-event: an event whose transaction commits after A read
    the events. A producer of asset b writes its event and stays uncommitted; an operator triggers a
    manual run of the consumer; the race event (asset a) is committed. B reads the queue and is held;
    A creates its run and commits: it consumed the race event only (the late one was not visible).
    The late event commits; a third scheduler creates a run of ``late_other`` (a second consumer of
    asset b; the other DAGs paused for that loop) that consumes it. B then creates its run with A's
    run_after: its window (no earlier asset run) holds both events, so it consumes both, one of them
    consumed by no run of this DAG: not a duplicate, it must run."""
    af, (a, b) = ctx.af, ctx.schedulers
    ids: dict[str, Any] = {}
    commit_late = hold_open_emit(af, "late_b_producer", "late_b", ids, "late")
    committed: list[bool] = []
    try:
        manual = af.trigger("late_consumer")  # its run_after: after the late event's timestamp
        ids["race"] = af.emit("late_a_producer", "late_a")
        events, restore = hold_after_queue_read(af, ("scheduler-b",))

        def steps() -> None:
            if not events["scheduler-b-read"].wait(60):
                raise TimeoutError("scheduler-b never read the queue")
            af.create_runs(a)
            committed.append(True)
            commit_late()
            with OnlyUnpaused(af, "late_other"):
                af.create_runs(af.new_scheduler("scheduler-c"))
            events["scheduler-b-go"].set()

        try:
            run_threads(af, steps, (b, "scheduler-b"))
        finally:
            restore()
    finally:
        if not committed:
            commit_late()
    return {
        "events": ids,
        "event_times": event_times(af, list(ids.values())),
        "manual_run_id": manual,
        "runs": run_rows("late_consumer"),
        "other_runs": run_rows("late_other"),
    }


def sc_second_consumer(ctx: Context) -> dict[str, Any]:
    """The race on ``shared_consumer`` after a run of a second consumer DAG of the same asset,
    ``shared_other`` (on shared | shared_extra), made in a scheduler loop of its own (its DAG alone
    unpaused) before the race: it consumed the race's event, has the lower id and the later
    run_after (its shared_extra queue row is newer). The duplicate's kept run is A's, of its own DAG."""
    af, (a, b) = ctx.af, ctx.schedulers
    events = [af.emit("shared_producer", "shared"), af.emit("shared_extra_producer", "shared_extra")]
    with OnlyUnpaused(af, "shared_other"):
        af.create_runs(af.new_scheduler("scheduler-c"))
    scenarios_asset_race(af, a, b)
    return {"events": events, "runs": run_rows("shared_consumer"), "other_runs": run_rows("shared_other")}


def sc_race_three(ctx: Context) -> dict[str, Any]:
    """Three schedulers read the queue before the first one commits. A creates its run and commits;
    the next event arrives (after the runs' run_after: no part of their events); B creates the run
    again (its guard skips it, a duplicate of A's) and commits; A's run is started meanwhile (its row
    rewritten by the state change, as ``_start_queued_dagruns`` does); then C creates it a third
    time. Both A's and B's runs consumed C's events: the note must name A's, the kept run."""
    af, (a, b) = ctx.af, ctx.schedulers
    c = af.new_scheduler("scheduler-c")
    out: dict[str, Any] = {"events": [af.emit("three_producer", "three")], "scheduler_c": c.job.id}
    events, restore = hold_after_queue_read(af, ("scheduler-b", "scheduler-c"))

    def steps() -> None:
        for name in ("scheduler-b", "scheduler-c"):
            if not events[f"{name}-read"].wait(60):
                raise TimeoutError(f"{name} never read the queue")
        af.create_runs(a)
        out["events"].append(af.emit("three_producer", "three"))
        events["scheduler-b-go"].set()
        next(t for t in threading.enumerate() if t.name == "scheduler-b").join(120)
        with af.create_session() as session:
            kept = session.query(af.DagRun).filter_by(dag_id="three_consumer", creating_job_id=a.job.id).one()
            kept.state = af.DagRunState.RUNNING
        events["scheduler-c-go"].set()

    try:
        run_threads(af, steps, (b, "scheduler-b"), (c, "scheduler-c"))
    finally:
        restore()
    out["runs"] = run_rows("three_consumer")
    out["event_times"] = event_times(af, out["events"])
    return out


def sc_disjoint(ctx: Context) -> dict[str, Any]:
    """The look-alike that is NOT a duplicate (scenarios_asset race_or_disjoint): A reads (a), an
    event of b arrives, B reads (a + b); A creates and commits; B creates a later run that consumes
    only the b event. The guard must leave B alone."""
    af, (a, b) = ctx.af, ctx.schedulers
    af.emit("disjoint_a_producer", "disjoint_a")
    events, restore = hold_after_queue_read(af, ("scheduler-a", "scheduler-b"))
    started: list[Any] = []

    def steps() -> None:
        if not events["scheduler-a-read"].wait(60):
            raise TimeoutError("scheduler-a never read the queue")
        af.emit("disjoint_b_producer", "disjoint_b")
        tb = threading.Thread(target=run_threads, args=(af, lambda: None, (b, "scheduler-b")), name="driver-b")
        tb.start()
        started.append(tb)
        if not events["scheduler-b-read"].wait(60):
            raise TimeoutError("scheduler-b never read the queue")
        events["scheduler-a-go"].set()

    try:
        run_threads(af, steps, (a, "scheduler-a"))
        events["scheduler-b-go"].set()
        for t in started:
            t.join(120)
    finally:
        events["scheduler-a-go"].set()
        events["scheduler-b-go"].set()
        restore()
    return {"runs": run_rows("disjoint_consumer")}


def emit_through_alias(af: Any, alias: str, asset_name: str) -> int:
    """A run of ``aliasov_producer`` whose ``publish`` task (outlets: the aliases) added an event for
    ``asset_name`` through ``alias`` (``outlet_events[AssetAlias(alias)].add(Asset(asset_name))``),
    recorded as Airflow's execution API records the task's success
    (``TaskInstance.register_asset_changes_in_db`` with the task's outlets and the outlet events the
    task SDK sends): the event, its alias link, the asset made on first use, the alias's DAGs queued."""
    from airflow.api_fastapi.execution_api.datamodels.asset import AssetProfile
    from airflow.models.asset import AssetEvent

    run_id = af.trigger("aliasov_producer")
    with af.create_session() as session:
        ti = session.query(af.TaskInstance).filter_by(dag_id="aliasov_producer", run_id=run_id).one()
        end = af_now()
        af.finish_ti(ti, end - _seconds(2), end)
        outlets = [AssetProfile(name=name, type="AssetAlias") for name in ("aliasov", "aliasov_other", "aliasrace")]
        key = {"name": asset_name, "uri": f"s3://warehouse/{asset_name}"}
        af.TaskInstance.register_asset_changes_in_db(
            ti, outlets, [{"dest_asset_key": key, "extra": {}, "source_alias_name": alias}], session
        )
        dr = session.query(af.DagRun).filter_by(dag_id="aliasov_producer", run_id=run_id).one()
        dr.state = af.DagRunState.SUCCESS
        dr.start_date, dr.end_date = end - _seconds(3), end
        session.flush()
        event = session.query(AssetEvent).filter_by(source_dag_id="aliasov_producer", source_run_id=run_id).one()
        return int(event.id)


def sc_alias_overlap(ctx: Context) -> dict[str, Any]:
    """The overlap race on a DAG scheduled on an asset alias (3.1 consumes the alias's events,
    ``AssetEvent.source_aliases``): the first event through the alias (asset aliasov_a) queues the
    DAG; B reads the queue and is held; a second event through it (asset aliasov_b) arrives; A creates
    a run consuming both; B creates an earlier run consuming the first one again. Before the race, an
    event through another DAG's alias (that DAG paused): in B's window, consumed by no one."""
    af = ctx.af
    with af.create_session() as session:
        session.query(af.DagModel).filter_by(dag_id="aliasov_other_consumer").update({"is_paused": True})
    other = emit_through_alias(af, "aliasov_other", "aliasov_other")
    first = emit_through_alias(af, "aliasov", "aliasov_a")
    second = overlap_race(ctx, lambda: emit_through_alias(af, "aliasov", "aliasov_b"))
    return {"other_event": other, "events": [first, second], "runs": run_rows("aliasov_consumer")}


def sc_alias_race(ctx: Context) -> dict[str, Any]:
    """The exact race on a DAG scheduled on an asset alias: one event through the alias, both
    schedulers create a run from it. 3.1 has both consume it; 3.0 reads scheduled assets only
    (scheduler_job_runner.py ``_create_dag_runs_asset_triggered``), so there both consume nothing."""
    event = emit_through_alias(ctx.af, "aliasrace", "aliasrace_a")
    scenarios_asset_race(ctx.af, *ctx.schedulers)
    return {"event": event, "runs": run_rows("aliasrace_consumer")}


def late_queue_row(ctx: Context, prefix: str, before: Any, after: Any = None) -> int:
    """An event of asset ``<prefix>_a`` from a producer transaction that stays open while other work
    commits (in a thread of its own, with its own sessions): ``before()`` once the event is flushed
    (its timestamp taken), before Airflow writes its queue row; ``after()`` once the queue row is
    written (its created_at taken), before the commit. Hooked where ``register_asset_change`` calls
    ``AssetManager._queue_dagruns``. Returns the event's id."""
    manager = ctx.af.AssetManager
    original = manager.__dict__["_queue_dagruns"]  # the classmethod object, restored as it was
    errors: list[BaseException] = []

    def meanwhile(step: Any) -> None:
        def work() -> None:
            try:
                step()
            except BaseException as err:  # noqa: BLE001 - re-raised in the producer's thread
                errors.append(err)

        thread = threading.Thread(target=work, name="meanwhile")
        thread.start()
        thread.join(120)
        if errors:
            raise errors[0]

    def queue_dagruns(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name != "producer-late":
            return original.__func__(cls, *args, **kwargs)
        meanwhile(before)
        result = original.__func__(cls, *args, **kwargs)
        if after is not None:
            meanwhile(after)
        return result

    event_id: list[int] = []

    def produce() -> None:
        try:
            event_id.append(ctx.af.emit(f"{prefix}_a_producer", f"{prefix}_a"))
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    manager._queue_dagruns = classmethod(queue_dagruns)
    try:
        producer = threading.Thread(target=produce, name="producer-late")
        producer.start()
        producer.join(300)
    finally:
        manager._queue_dagruns = original
    if errors:
        raise errors[0]
    return event_id[0]


def queue_created_at(af: Any, dag_id: str) -> Any:
    """The DAG's queue rows' latest created_at: the run_after a scheduler reading them now gives."""
    from airflow.models.asset import AssetDagRunQueue

    with af.create_session() as session:
        return max(r.created_at for r in session.query(AssetDagRunQueue).filter_by(target_dag_id=dag_id))


def sc_empty_window_race(ctx: Context) -> dict[str, Any]:
    """The race on runs whose event window is empty. The late producer's event (asset a) is flushed;
    meanwhile an event of asset b is committed and scheduler-c makes run P from it (run_after later
    than the late event's timestamp); then the late producer writes its queue row and commits. Both
    schedulers then create a run from that row (the exact race): run_after its created_at, after P's,
    so their window (P's run_after, run_after] holds no event: both consume nothing. A manual run
    with that very run_after is made first (no asset run: never a candidate)."""
    af = ctx.af
    out: dict[str, Any] = {}

    def before() -> None:
        out["p_event"] = af.emit("emptyrace_b_producer", "emptyrace_b")
        af.create_runs(af.new_scheduler("scheduler-c"))

    out["late_event"] = late_queue_row(ctx, "emptyrace", before)
    af.trigger("emptyrace_consumer", run_after=queue_created_at(af, "emptyrace_consumer"))
    scenarios_asset_race(af, *ctx.schedulers)
    out["runs"] = run_rows("emptyrace_consumer")
    return out


def sc_empty_window_lookalike(ctx: Context) -> dict[str, Any]:
    """Its look-alike, no race and no duplicate: as above, run P is made while the late producer's
    event is flushed; once the late queue row is written (not committed), an event of asset b
    arrives and scheduler-a makes run A from it (a later run_after; it cannot see the late row);
    after the late commit scheduler-b makes run B from the late row: the only run made from it, with
    an earlier run_after than A's and an empty window. The guard must leave B alone."""
    af, (a, b) = ctx.af, ctx.schedulers
    out: dict[str, Any] = {}

    def before() -> None:
        out["p_event"] = af.emit("emptylook_b_producer", "emptylook_b")
        af.create_runs(af.new_scheduler("scheduler-c"))

    def after() -> None:
        out["a_event"] = af.emit("emptylook_b_producer", "emptylook_b")
        af.create_runs(a)

    out["late_event"] = late_queue_row(ctx, "emptylook", before, after)
    af.create_runs(b)
    out["runs"] = run_rows("emptylook_consumer")
    return out


def dag_run_class(af: Any) -> Any:
    """The class whose create_dagrun the scheduler calls (3.0: DAG via SerializedDAG; 3.1: SerializedDAG)."""
    from airflow.serialization.serialized_objects import SerializedDAG

    return SerializedDAG


def sc_unlocked(ctx: Context, inverted: bool = False) -> dict[str, Any]:
    """[scheduler] use_row_level_locking = False: nothing serialises the creators
    (docs/explanation/airflow-internals.md, "The scheduler's run-creation step"). Both
    read the queue; A creates its run and, still uncommitted, waits until B is creating its own run
    (B's guard waiting for A's lock, or, without that lock, B's run created); then A commits.

    ``inverted`` (on DAG unlockedinv): A's run is flushed first (the lower id), but B's guard takes
    the per-DAG lock first (A's guard is held right before it, as partitioned-inverted on 3.2), so B
    commits first and A's guard, after waiting for B's commit, finds B's run: the higher id."""
    af, (a, b) = ctx.af, ctx.schedulers
    prefix = "unlockedinv" if inverted else "unlocked"
    # Without row locks Airflow's scheduled path races too (two inserts of one scheduled run_id, a
    # unique violation): create daily_etl's scheduled run first, with one scheduler.
    af.create_runs(a)
    af.emit(f"{prefix}_producer", prefix)
    events, restore = hold_after_queue_read(af, ("scheduler-a", "scheduler-b"))
    cls = dag_run_class(af)
    original = cls.create_dagrun
    a_created, b_created = threading.Event(), threading.Event()
    a_in_hook, b_locked = threading.Event(), threading.Event()
    guard = ctx.guard._dupguard_guard if ctx.guard else None
    waits_before = getattr(guard, "lock_waits", 0) if guard else 0
    locks_a: list[int] = []

    def b_is_creating() -> bool:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b_created.is_set() or (guard is not None and getattr(guard, "lock_waits", 0) > waits_before):
                return True
            time.sleep(0.005)
        return False

    def create_dagrun(self: Any, *c_args: Any, **c_kwargs: Any) -> Any:
        name = threading.current_thread().name
        if name == "scheduler-b":
            (a_in_hook if inverted else a_created).wait(60)
        run = original(self, *c_args, **c_kwargs)
        if name == "scheduler-a":
            a_created.set()
            a_in_hook.set()
            if not inverted:
                locks_a.append(advisory_locks())  # A's guard holds its per-DAG lock until A commits
                b_is_creating()
        elif name == "scheduler-b":
            b_created.set()
        return run

    def steps() -> None:
        for name in ("scheduler-a", "scheduler-b"):
            if not events[f"{name}-read"].wait(60):
                raise TimeoutError(f"{name} never read the queue")
        events["scheduler-a-go"].set()
        events["scheduler-b-go"].set()

    cls.create_dagrun = create_dagrun  # type: ignore[method-assign]
    restore_lock = hold_a_before_the_lock(ctx.guard, a_in_hook, b_locked) if inverted else lambda: None
    try:
        run_threads(af, steps, (a, "scheduler-a"), (b, "scheduler-b"))
    finally:
        cls.create_dagrun = original  # type: ignore[method-assign]
        restore_lock()
        restore()
    return {
        "runs": run_rows(f"{prefix}_consumer"),
        "lock_waits": (getattr(guard, "lock_waits", 0) - waits_before) if guard else 0,
        "advisory_locks_a": locks_a,
    }


def sc_callback(ctx: Context) -> dict[str, Any]:
    """The race on a DAG with on_success_callback, then Airflow's own scheduling
    loop (``_do_scheduling``) several times: which runs end in which state, and which DAG callbacks
    the scheduler sends (recorded where it hands them to the executor's callback sink)."""
    af, (a, b) = ctx.af, ctx.schedulers
    af.emit("callback_producer", "callback")
    scenarios_asset_race(af, a, b)
    # The kept run's task did its work (as a worker would have): no executor is needed below.
    with af.create_session() as session:
        kept = session.query(af.DagRun).filter_by(dag_id="callback_consumer", creating_job_id=a.job.id).one()
        end = af_now()
        for ti in session.query(af.TaskInstance).filter_by(dag_id="callback_consumer", run_id=kept.run_id):
            af.finish_ti(ti, end - _seconds(1), end)
    callbacks = schedule_only(ctx, "callback_consumer")
    return {"runs": run_rows("callback_consumer"), "callbacks": callbacks}


def schedule_only(ctx: Context, dag_id: str) -> list[dict[str, Any]]:
    """Airflow's own scheduling loop (``_do_scheduling``, the two schedulers in turn, 4 times) on
    ``dag_id`` alone; the DAG callbacks it sends, recorded where it hands them to the executor's
    callback sink. Every other DAG is paused meanwhile (the scheduler leaves paused DAGs' runs
    alone): other scenarios' runs would need an executor."""
    af, (a, b) = ctx.af, ctx.schedulers
    with af.create_session() as session:
        others = [dm.dag_id for dm in session.query(af.DagModel).filter(af.DagModel.dag_id != dag_id)]
        for dm in session.query(af.DagModel).filter(af.DagModel.dag_id.in_(others)):
            dm.is_paused = True
    sent: list[dict[str, Any]] = []

    def record(dag: Any, callback: Any = None) -> None:
        if callback is not None:
            sent.append(
                {
                    "run_id": getattr(callback, "run_id", None),
                    "is_failure": bool(getattr(callback, "is_failure_callback", False)),
                    "msg": getattr(callback, "msg", None),
                }
            )

    for runner in (a, b):
        runner._send_dag_callbacks_to_processor = record
    for i in range(4):
        session = af.settings.Session()
        try:
            (a, b)[i % 2]._do_scheduling(session)
            session.commit()
        finally:
            session.close()
            af.settings.Session.remove()
    with af.create_session() as session:
        for dm in session.query(af.DagModel).filter(af.DagModel.dag_id.in_(others)):
            dm.is_paused = False
    return sent


def scenarios_asset_race(af: Any, a: Any, b: Any) -> None:
    import scenarios_asset

    scenarios_asset.race(af, a, b)


class Context:
    def __init__(self, af: Any, guard: Any) -> None:
        self.af = af
        self.guard = guard
        self.schedulers = (af.new_scheduler("scheduler-a"), af.new_scheduler("scheduler-b"))
        self.guard_logs: list[dict[str, Any]] = []


class _Capture(logging.Handler):
    def __init__(self, sink: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.sink.append(
            {
                "level": record.levelname,
                "message": record.getMessage(),
                "traceback": bool(record.exc_info),
                "error": None if error is None else f"{type(error).__name__}: {error}",
            }
        )


def af_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _seconds(n: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=n)


ASSET_SCENARIOS = {
    "race": sc_race,
    "race-again": sc_race_again,
    "broken-python": lambda ctx: sc_broken(ctx, "python", "brokenpy"),
    "broken-sql": lambda ctx: sc_broken(ctx, "sql", "brokensql"),
    "ordinary": sc_ordinary,
    "overlap": sc_overlap,
    "disjoint": sc_disjoint,
    "unlocked": sc_unlocked,
    "unlocked-inverted": lambda ctx: sc_unlocked(ctx, inverted=True),
    "callback": sc_callback,
    "broken-finish": sc_broken_finish,
    "broken-note": sc_broken_note,
    "small-cache": sc_small_cache,
    "metrics": sc_metrics,
    "notasks": sc_notasks,
    "alias-overlap": sc_alias_overlap,
    "alias-race": sc_alias_race,
    "empty-window-race": sc_empty_window_race,
    "empty-window-lookalike": sc_empty_window_lookalike,
    "mapped-later": lambda ctx: sc_mapped_later(ctx, "mapped"),
    "mapped-later-cold": lambda ctx: sc_mapped_later(ctx, "mappedcold"),
    "late-event": sc_late_event,
    "second-consumer": sc_second_consumer,
    "race-three": sc_race_three,
    "bounds": sc_bounds,
}


def prepare_asset_dags() -> Any:
    """The scenarios' DAGs written, parsed and serialised into the database; Airflow's entry points."""
    import scenarios_asset

    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "guard_dags.py").write_text(
        DAG_HEADER
        + "".join(ASSET_DAG.format(p=p) for p in ASSET_PREFIXES if p != "callback")
        + "".join(EITHER_DAG.format(p=p) for p in (*EITHER_PREFIXES, *EMPTY_WINDOW_PREFIXES))
        + ALIAS_DAG
        + SECOND_CONSUMER_DAGS
        + REPORT_SENT
        + "".join(CALLBACK_DAG.format(p=p, tasks=tasks) for p, tasks in CALLBACK_TASKS.items())
        + "".join(MAPPED_LATER_DAG.format(p=p) for p in MAPPED_LATER_PREFIXES)
    )
    af = scenarios_asset.AF()
    af.sync_dags(dags)
    return af


def run_asset_scenarios(args: argparse.Namespace, result: dict[str, Any], af: Any = None) -> None:
    """The asset scenarios on DAGs ``prepare_asset_dags`` made (here, or before: tests/guard/mutants.py)."""
    af = af or prepare_asset_dags()
    guard = loaded_guard()
    result["policy"] = policy_facts(guard)
    result["local_settings_files"] = local_settings_files()
    ctx = Context(af, guard)
    logging.getLogger("dupguard.guard").addHandler(_Capture(ctx.guard_logs))
    result["job_ids"] = {"scheduler-a": ctx.schedulers[0].job.id, "scheduler-b": ctx.schedulers[1].job.id}
    for name in args.scenarios:
        before = guard._dupguard_guard.queries if guard else 0
        statements_before = getattr(guard._dupguard_guard, "statements", 0) if guard else 0
        out = ASSET_SCENARIOS[name](ctx)
        if guard is not None:
            out["guard_queries"] = guard._dupguard_guard.queries - before
            out["guard_statements"] = getattr(guard._dupguard_guard, "statements", 0) - statements_before
        result[name] = out
    if guard is not None:
        result["guard"] = guard_counters(guard)
    if args.snippet_names:
        result["snippet_names"] = snippet_names_vs_settings(args.snippet_names)


def snippet_names_vs_settings(path: Path) -> dict[str, Any]:
    """Airflow copies airflow_local_settings' names into airflow.settings: which would collide, and how.

    Run in a process without the guard; the snippet is executed as a plain module last (it flips
    the verify_integrity switch, which no longer matters then).
    """
    import types

    from airflow import settings

    module = types.ModuleType("dupguard_snippet_probe")
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - our own snippet
    names = sorted(n for n in module.__dict__ if not n.startswith("__"))
    return {
        "names": names,
        # The hook itself is registered as a policy plugin, never copied (settings keeps its dispatcher).
        "collisions": {
            n: getattr(settings, n) is module.__dict__[n]
            for n in names
            if hasattr(settings, n) and n != "task_instance_mutation_hook"
        },
    }


# Scenarios, 3.2 (partitioned) --------------------------------------------------------------------------


def loop_in_race(
    sp: Any,
    runner: Any,
    name: str,
    after_read: Any,
    errors: list[BaseException],
    both_read: threading.Barrier,
    a_committed: threading.Event,
    wake: tuple[threading.Event, ...] = (),
) -> None:
    """One scheduler loop of a racing creator, in its thread: an error is kept for the main thread and
    releases every step waiting on the other creator; scheduler-a's end, committed or not, lets B go on."""
    try:
        sp.scheduler_loop(runner, after_apdr_read=after_read)
    except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
        errors.append(err)
        both_read.abort()
        for event in wake:
            event.set()
    finally:
        if name == "scheduler-a":
            a_committed.set()


def partitioned_race(
    sp: Any, schedulers: tuple[Any, Any], scenario: str, partition_key: str, guard: Any = None
) -> dict[str, Any]:
    """serial: B creates its run after A committed. overlap: B creates its run while A's is uncommitted.

    Both schedulers first read the pending partition row (the race), as scenarios_partitioned does.
    In ``overlap`` A creates its run, then keeps its transaction open until B is creating its own run:
    until B's guard found the (dag, key) lock taken (it then waits for A's commit), or, without that
    lock (no guard, or an older guard), until B's run is created. Then A commits.
    """
    waits_before = getattr(guard._dupguard_guard, "lock_waits", 0) if guard is not None else 0

    def b_is_creating(b_created: threading.Event) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if b_created.is_set():
                return
            if guard is not None and getattr(guard._dupguard_guard, "lock_waits", 0) > waits_before:
                return
            time.sleep(0.005)

    from airflow.serialization.definitions.dag import SerializedDAG

    a, b = schedulers
    before = {r["id"] for r in run_rows(sp.CONSUMER)}
    late_before = {r["id"] for r in run_rows(LATE_CONSUMER)}
    out: dict[str, Any] = {"race_event_id": sp.produce_event(partition_key), "apdr_read": {}}
    both_read = threading.Barrier(2, timeout=60)
    a_committed, a_created, b_created = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    original_create = SerializedDAG.create_dagrun

    # inverted: A's run is flushed first (the lower id), but B's guard takes the (dag, key) lock
    # first; A's guard then waits for B's commit. A is held inside its guard, right before the lock.
    a_in_hook, b_locked = threading.Event(), threading.Event()
    restore_lock = (
        hold_a_before_the_lock(guard, a_in_hook, b_locked) if scenario == "partitioned-inverted" else lambda: None
    )
    restore_late = late_event(sp, partition_key, out) if scenario == "partitioned-late-event" else lambda: None

    def create_dagrun(self: Any, *c_args: Any, **c_kwargs: Any) -> Any:
        name = threading.current_thread().name
        if scenario == "partitioned-overlap" and name == "scheduler-b":
            a_created.wait(60)  # A's run exists (uncommitted) before B creates its own
        if scenario == "partitioned-inverted" and name == "scheduler-b":
            a_in_hook.wait(60)  # A's run is flushed and A is in its guard (older guard: created)
        run = original_create(self, *c_args, **c_kwargs)
        if name == "scheduler-a":
            a_created.set()
            a_in_hook.set()
            if scenario == "partitioned-overlap":
                b_is_creating(b_created)  # A commits only once B is creating its run
        elif name == "scheduler-b":
            b_created.set()
        return run

    def after_read(name: str) -> Any:
        def wait(apdr_ids: list[int]) -> None:
            out["apdr_read"][name] = apdr_ids
            both_read.wait()
            if (
                scenario in ("partitioned-serial", "partitioned-late-event", "partitioned-again")
                and name == "scheduler-b"
            ):
                a_committed.wait(60)

        return wait

    def work(runner: Any, name: str) -> None:
        wake = (a_created, b_created, a_in_hook, b_locked)
        loop_in_race(sp, runner, name, after_read(name), errors, both_read, a_committed, wake)

    SerializedDAG.create_dagrun = create_dagrun  # type: ignore[method-assign]
    try:
        threads = [
            threading.Thread(target=work, args=(a, "scheduler-a"), name="scheduler-a"),
            threading.Thread(target=work, args=(b, "scheduler-b"), name="scheduler-b"),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        SerializedDAG.create_dagrun = original_create  # type: ignore[method-assign]
        restore_lock()
        restore_late()
    if errors:
        raise errors[0]
    out["runs"] = [r for r in run_rows(sp.CONSUMER) if r["id"] not in before]
    out["apdr_pointers"] = {str(k): v for k, v in sp.apdr_pointers().items()}
    if scenario == "partitioned-late-event":
        out["late_consumer_runs"] = [r for r in run_rows(LATE_CONSUMER) if r["id"] not in late_before]
    return out


def late_event(sp: Any, partition_key: str, out: dict[str, Any]) -> Any:
    """An event for the same partition key committed while A's run is made but not committed: after
    A read the pending row's events (it consumes only those), before A's commit. Airflow adds it to
    the same pending row (A's update of the row is not visible yet), so the row B creates its run
    from has an event A did not consume. Made in a thread of its own (its own session; it waits for
    no lock A holds), when A's run creation calls ``DagModel.dags_needing_dagruns`` (the step after
    the partitioned runs). Returns a function restoring Airflow's method."""
    from airflow.models.dag import DagModel

    original = DagModel.dags_needing_dagruns  # bound classmethod
    fired: list[bool] = []

    def dags_needing_dagruns(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "scheduler-a" and not fired:
            fired.append(True)
            producer = threading.Thread(target=lambda: produce_late(sp, partition_key, out))
            producer.start()
            producer.join(60)
        return original(*args, **kwargs)

    DagModel.dags_needing_dagruns = classmethod(dags_needing_dagruns)  # type: ignore[method-assign]

    def restore() -> None:
        DagModel.dags_needing_dagruns = original  # type: ignore[method-assign]

    return restore


def produce_late(sp: Any, partition_key: str, out: dict[str, Any]) -> None:
    """The late event, then an ``orders`` event: it queues LATE_CONSUMER (``orders | hourly_sales``,
    not partitioned), whose run, made by A in the same transaction (``dags_needing_dagruns`` is
    called next), consumes every hourly_sales event of its window, the late one too. So when B
    decides, the late event was consumed by a committed run, only not by A's."""
    out["late_event_id"] = sp.produce_event(partition_key)
    out["orders_event_id"] = sp.produce_event(None, producer=sp.PRODUCE_ORDERS, asset_name=sp.ORDERS)


# A second consumer of the partitioned asset, not partitioned: triggered by an orders event only (3.2
# queues no non-partitioned DAG for a partitioned event), consuming the hourly_sales events too.
LATE_CONSUMER = "consume_orders_or_sales"
LATE_CONSUMER_DAG = f"""
with DAG({LATE_CONSUMER!r}, schedule=(orders | sales), catchup=False):
    Noop(task_id='extract')
"""


def partitioned_again(sp: Any, schedulers: tuple[Any, Any], partition_key: str, guard: Any) -> dict[str, Any]:
    """partitioned-serial on a key that already ran once: an undisturbed run of the key first (its
    own pending row and event), then a new event for the key (a new row) and the race on it. The
    duplicate's twin is the race's first run, not the first round's (whose row is consumed too)."""
    sp.produce_event(partition_key)
    sp.scheduler_loop(schedulers[0])
    first_round = [r for r in run_rows(sp.CONSUMER) if r["partition_key"] == partition_key]
    out = partitioned_race(sp, schedulers, "partitioned-again", partition_key, guard)
    out["first_round"] = first_round
    return out


class VirtualClock:
    """The guard's ``time`` (its module global) made virtual: ``sleep`` advances ``monotonic`` at
    once, after ``on_sleep(now, seconds)``. Starts at the real clock (the guard's log rate limits
    compare with it), so every reading is positive and within a factor 2 of the others: the
    guard's ``deadline - now`` is then exact (Sterbenz), and a sleep cut at the deadline ends
    exactly on it."""

    def __init__(self, on_sleep: Any) -> None:
        self.now = time.monotonic()
        self.on_sleep = on_sleep

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.on_sleep(self.now, seconds)
        self.now += seconds


def partitioned_two_keys(sp: Any, scheduler: Any, key_prefix: str, guard: Any) -> dict[str, Any]:
    """One scheduler transaction creating the runs of two partition keys of one DAG while two other
    sessions hold the two keys' (dag, key) locks, on a virtual clock (no timing). The first key's
    holder lets go as soon as the waiter's clock passes the transaction's deadline (a sleep not cut
    at it); the second key's holder lets go at the first sleep of the wait for it (a second budget).
    The guard keeps one budget per transaction and polls last at its deadline: both waits time out,
    both runs go through untouched, and neither lock was let go while the guard waited."""
    from airflow import settings
    from sqlalchemy import func, select

    g = guard._dupguard_guard
    keys = [f"{key_prefix}:00:00", f"{key_prefix}:30:00"]
    before = {r["id"] for r in run_rows(sp.CONSUMER)}
    out: dict[str, Any] = {"keys": keys, "counters_before": guard_counters(guard), "released_in_wait": []}
    out["event_ids"] = [sp.produce_event(key) for key in keys]
    waited: list[tuple[str, ...]] = []  # the lock keys take_lock was called for, in order
    transactions: list[Any] = []
    holders: dict[tuple[str, ...], Any] = {}

    def release(lock_key: tuple[str, ...], why: str) -> None:
        transaction = holders.pop(lock_key, None)
        if transaction is not None:
            transaction.commit()  # the holder's transaction ends: its advisory lock is released
            out["released_in_wait"].append({"key": list(lock_key), "why": why})

    def on_sleep(now: float, seconds: float) -> None:
        if len(waited) == 1:
            deadline = g._wait_deadlines.get(transactions[-1])
            if deadline is not None and now + seconds > deadline:
                release(waited[0], "the first wait slept past the deadline")
        elif len(waited) == 2:
            release(waited[1], "the second wait slept")

    original_take = g.take_lock

    def take_lock(connection: Any, lock_key: tuple[str, ...], session: Any) -> Any:
        waited.append(tuple(lock_key))
        transactions.append(session.get_transaction())
        return original_take(connection, lock_key, session)

    clock, saved_time, saved_wait = VirtualClock(on_sleep), guard.time, g.lock_wait
    with settings.engine.connect() as first, settings.engine.connect() as second:
        for connection, key in ((first, keys[0]), (second, keys[1])):
            transaction = connection.begin()
            lock_id = guard._dupguard_lock_id((sp.CONSUMER, key))
            if not connection.execute(select(func.pg_try_advisory_xact_lock(lock_id))).scalar():
                raise RuntimeError("could not take the (dag, key) lock for the test")
            holders[(sp.CONSUMER, key)] = transaction
        g.take_lock, guard.time, g.lock_wait = take_lock, clock, 0.3
        try:
            sp.scheduler_loop(scheduler)
        finally:
            g.__dict__.pop("take_lock", None)
            guard.time, g.lock_wait = saved_time, saved_wait
            for transaction in holders.values():
                transaction.commit()
    out["waited"] = [list(key) for key in waited]
    out["runs"] = [r for r in run_rows(sp.CONSUMER) if r["id"] not in before]
    return out


def partitioned_fresh_and_raced(sp: Any, schedulers: tuple[Any, Any], key_prefix: str) -> dict[str, Any]:
    """One transaction creating two runs of one DAG, the first not a duplicate, the second one (each
    must be decided as itself). CONSUME_AND runs a key once it has events of both its assets. Both
    schedulers read the pending rows of two keys: ``fresh``'s row (made first) with sales_eu's event
    only, ``raced``'s with both. A creates raced's run (fresh's is not ready) and commits; then
    sales_us's event for fresh completes that row, and B creates fresh's run (not a duplicate) and
    then raced's (a duplicate of A's), in the pending rows' order."""
    fresh, raced = f"{key_prefix}:00:00", f"{key_prefix}:30:00"
    before = {r["id"] for r in run_rows(sp.CONSUME_AND)}
    events = {"fresh_eu": sp.produce_event(fresh, producer=sp.PRODUCE_EU, asset_name=sp.SALES_EU)}
    events["raced_eu"] = sp.produce_event(raced, producer=sp.PRODUCE_EU, asset_name=sp.SALES_EU)
    events["raced_us"] = sp.produce_event(raced, producer=sp.PRODUCE_US, asset_name=sp.SALES_US)
    both_read = threading.Barrier(2, timeout=60)
    a_committed = threading.Event()
    errors: list[BaseException] = []

    def complete_fresh() -> None:
        events["fresh_us"] = sp.produce_event(fresh, producer=sp.PRODUCE_US, asset_name=sp.SALES_US)

    def after_read(name: str) -> Any:
        def wait(apdr_ids: list[int]) -> None:
            both_read.wait()
            if name == "scheduler-b":
                a_committed.wait(60)
                producer = threading.Thread(target=complete_fresh)  # its own session, committed
                producer.start()
                producer.join(60)

        return wait

    def work(runner: Any, name: str) -> None:
        loop_in_race(sp, runner, name, after_read(name), errors, both_read, a_committed)

    names = ("scheduler-a", "scheduler-b")
    threads = [threading.Thread(target=work, args=(r, n), name=n) for r, n in zip(schedulers, names, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    runs = [r for r in run_rows(sp.CONSUME_AND) if r["id"] not in before]
    return {"fresh": fresh, "raced": raced, "events": events, "runs": runs}


PARTITIONED_SCENARIOS = {
    "partitioned-serial": "2026-11-30T05:00:00",
    "partitioned-overlap": "2026-11-30T06:00:00",
    "partitioned-timeout": "2026-11-30T07:00:00",
    "partitioned-inverted": "2026-11-30T09:00:00",
    "partitioned-late-event": "2026-11-30T10:00:00",
    "partitioned-stress": "2026-11-30T08",  # prefix of the stress keys
    "partitioned-again": "2026-11-30T11:00:00",
    "partitioned-two-keys": "2026-11-30T12",  # prefix of its two keys
    "partitioned-fresh-and-raced": "2026-11-30T13",  # prefix of its two keys
}
STRESS_CONSUMERS = 8
STRESS_KEYS = 4


STRESS_ASSET, STRESS_PRODUCER = "stress_sales", "produce_stress_sales"


def stress_dag_source(sp: Any) -> str:
    """A second partitioned asset with STRESS_CONSUMERS consumers (IdentityMapper): one pending row
    per (consumer, key). Its own asset, so the two-run races above involve only sp.CONSUMER."""
    lines = [
        "",
        f"stress_sales = Asset(name={STRESS_ASSET!r})",
        "",
        f"with DAG({STRESS_PRODUCER!r}, schedule=producer_schedule, catchup=False):",
        "    Noop(task_id='write', outlets=[stress_sales])",
    ]
    for i in range(STRESS_CONSUMERS):
        lines += [
            "",
            "with DAG(",
            f"    'stress_consumer_{i}',",
            "    schedule=PartitionedAssetTimetable(assets=stress_sales, default_partition_mapper=IdentityMapper()),",
            "    catchup=False,",
            "):",
            "    Noop(task_id='extract') >> Noop(task_id='load')",
        ]
    return "\n".join(lines) + "\n"


def partitioned_timeout(sp: Any, schedulers: tuple[Any, Any], partition_key: str, guard: Any) -> dict[str, Any]:
    """The overlap interleaving while a third session holds the (dag, key) lock: neither creator can
    take it within its wait budget; both runs go through, untouched (fail open), and it is logged."""
    from airflow import settings
    from sqlalchemy import func, select

    g = guard._dupguard_guard
    saved_wait, g.lock_wait = g.lock_wait, 0.3
    lock_id = guard._dupguard_lock_id((sp.CONSUMER, partition_key))
    try:
        # Its own connection (not the thread's scoped session, which run_rows commits).
        with settings.engine.connect() as holder, holder.begin():
            if not holder.execute(select(func.pg_try_advisory_xact_lock(lock_id))).scalar():
                raise RuntimeError("could not take the (dag, key) lock for the test")
            out = partitioned_race(sp, schedulers, "partitioned-overlap", partition_key, guard)
    finally:
        g.lock_wait = saved_wait
    return out


def partitioned_stress(sp: Any, schedulers: tuple[Any, Any], key_prefix: str) -> dict[str, Any]:
    """Two schedulers creating runs for many DAGs and keys at once, both having read every pending row
    (STRESS_CONSUMERS x STRESS_KEYS), then looping until nothing is pending. Reports wall time and
    what every (dag, key) got; any exception (deadlock, lock timeout in Airflow) is re-raised."""
    a, b = schedulers
    before = {r["id"] for r in run_rows()}
    for k in range(STRESS_KEYS):
        sp.produce_event(f"{key_prefix}:{k:02d}:00", producer=STRESS_PRODUCER, asset_name=STRESS_ASSET)
    both_read = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []
    loops = {"scheduler-a": 0, "scheduler-b": 0}

    def work(runner: Any, name: str) -> None:
        try:
            sp.scheduler_loop(runner, after_apdr_read=lambda ids: both_read.wait())
            loops[name] += 1
            while any(v is None for v in sp.apdr_pointers().values()) and loops[name] < 10:
                sp.scheduler_loop(runner)
                loops[name] += 1
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            both_read.abort()

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(r, n), name=n) for r, n in ((a, "scheduler-a"), (b, "scheduler-b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    seconds = time.monotonic() - started
    if errors:
        raise errors[0]
    runs = [r for r in run_rows() if r["id"] not in before and r["dag_id"].startswith("stress_consumer_")]
    return {"seconds": round(seconds, 3), "loops": loops, "runs": runs, "pending": sp.apdr_pointers()}


def prepare_partitioned_dags() -> Any:
    """The partitioned DAGs written, parsed and serialised into the database; the scenarios module."""
    import scenarios_partitioned as sp

    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    source = sp.dag_file_source([sp.CONSUMER, sp.CONSUME_ORDERS, sp.CONSUME_AND]) + LATE_CONSUMER_DAG
    (dags / "partitioned_sales.py").write_text(source + stress_dag_source(sp))
    sp.serialize_dags()
    producers = [sp.PRODUCER, sp.PRODUCE_ORDERS, sp.PRODUCE_EU, sp.PRODUCE_US]
    sp.check_unpaused([*producers, sp.CONSUMER, sp.CONSUME_ORDERS, sp.CONSUME_AND, LATE_CONSUMER])
    return sp


def run_partitioned_scenarios(args: argparse.Namespace, result: dict[str, Any], sp: Any = None) -> None:
    """The partitioned scenarios on DAGs ``prepare_partitioned_dags`` made (here, or before)."""
    sp = sp or prepare_partitioned_dags()
    guard = loaded_guard()
    result["policy"] = policy_facts(guard)
    schedulers = (sp.new_scheduler("scheduler-a"), sp.new_scheduler("scheduler-b"))
    result["job_ids"] = {"scheduler-a": schedulers[0].job.id, "scheduler-b": schedulers[1].job.id}
    guard_logs: list[dict[str, Any]] = []
    logging.getLogger("dupguard.guard").addHandler(_Capture(guard_logs))
    result["guard_logs"] = guard_logs
    sp.produce_event("2026-11-30T04:00:00")
    sp.scheduler_loop(schedulers[0])  # an ordinary, undisturbed run first
    result["ordinary_runs"] = run_rows(sp.CONSUMER)
    # An ordinary asset run without a partition (3.2 locks that path itself): no lookup, no error.
    queries_before = guard._dupguard_guard.queries if guard else 0
    sp.produce_event(None, producer=sp.PRODUCE_ORDERS, asset_name=sp.ORDERS)
    sp.scheduler_loop(schedulers[0])
    result["asset_run"] = {
        "runs": run_rows(sp.CONSUME_ORDERS),
        "guard_queries": (guard._dupguard_guard.queries - queries_before) if guard else None,
        "guard_logs": list(guard_logs),
    }
    for name in args.scenarios:
        before = guard._dupguard_guard.queries if guard else 0
        if name == "partitioned-stress":
            out = partitioned_stress(sp, schedulers, PARTITIONED_SCENARIOS[name])
        elif name == "partitioned-timeout":
            out = partitioned_timeout(sp, schedulers, PARTITIONED_SCENARIOS[name], guard)
        elif name == "partitioned-again":
            out = partitioned_again(sp, schedulers, PARTITIONED_SCENARIOS[name], guard)
        elif name == "partitioned-two-keys":
            out = partitioned_two_keys(sp, schedulers[0], PARTITIONED_SCENARIOS[name], guard)
        elif name == "partitioned-fresh-and-raced":
            out = partitioned_fresh_and_raced(sp, schedulers, PARTITIONED_SCENARIOS[name])
        else:
            out = partitioned_race(sp, schedulers, name, PARTITIONED_SCENARIOS[name], guard)
        if guard is not None:
            out["guard_queries"] = guard._dupguard_guard.queries - before
            out["guard_after"] = guard_counters(guard)
        result[name] = out
    if guard is not None:
        result["guard"] = guard_counters(guard)


def guard_counters(guard: Any) -> dict[str, Any]:
    g = guard._dupguard_guard
    return {
        "queries": g.queries,
        "skipped_runs": g.skipped_runs,
        "statements": getattr(g, "statements", None),
        "lock_waits": getattr(g, "lock_waits", None),
        "lock_timeouts": getattr(g, "lock_timeouts", None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        required=True,
        type=lambda text: text.split(","),
        help=f"comma-separated: {', '.join([*ASSET_SCENARIOS, *PARTITIONED_SCENARIOS])}",
    )
    parser.add_argument("--mode", required=True, choices=["none", "local-settings", "entry-point", "installed"])
    parser.add_argument("--no-row-locking", action="store_true", help="[scheduler] use_row_level_locking = False")
    parser.add_argument("--local-settings", type=Path)
    parser.add_argument("--site", type=Path)
    parser.add_argument("--snippet-names", type=Path, help="also report the snippet's names vs airflow.settings")
    parser.add_argument("--db-url", required=True)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="dupguard-guard-"))
    try:
        setup_environment(args, home)
        import airflow

        result: dict[str, Any] = {"airflow_version": airflow.__version__, "mode": args.mode}
        if args.scenarios[0] in PARTITIONED_SCENARIOS:
            run_partitioned_scenarios(args, result)
        else:
            run_asset_scenarios(args, result)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()

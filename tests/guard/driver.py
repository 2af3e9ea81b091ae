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

ASSET_PREFIXES = ("orders", "brokenpy", "brokensql", "plain")
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
            "AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING": "True",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        }
    )
    if args.mode == "local-settings":
        shutil.copyfile(args.local_settings, home / "config" / "airflow_local_settings.py")
    elif args.mode == "entry-point":
        sys.path.insert(0, str(args.site))
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
            return text("SELECT 1/0, false")

        guard._dupguard_guard.asset_statement = division_by_zero
        guard._dupguard_guard.partitioned_statement = division_by_zero


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
    return race_once(ctx, "orders")


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
        self.sink.append(
            {"level": record.levelname, "message": record.getMessage(), "traceback": bool(record.exc_info)}
        )


def af_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def _seconds(n: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=n)


ASSET_SCENARIOS = {
    "race": sc_race,
    "broken-python": lambda ctx: sc_broken(ctx, "python", "brokenpy"),
    "broken-sql": lambda ctx: sc_broken(ctx, "sql", "brokensql"),
    "ordinary": sc_ordinary,
}


def run_asset_scenarios(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import scenarios_asset

    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "guard_dags.py").write_text(DAG_HEADER + "".join(ASSET_DAG.format(p=p) for p in ASSET_PREFIXES))
    af = scenarios_asset.AF()
    guard = loaded_guard()
    result["policy"] = policy_facts(guard)
    af.sync_dags(dags)
    ctx = Context(af, guard)
    logging.getLogger("dupguard.guard").addHandler(_Capture(ctx.guard_logs))
    result["job_ids"] = {"scheduler-a": ctx.schedulers[0].job.id, "scheduler-b": ctx.schedulers[1].job.id}
    for name in args.scenarios:
        before = guard._dupguard_guard.queries if guard else 0
        out = ASSET_SCENARIOS[name](ctx)
        if guard is not None:
            out["guard_queries"] = guard._dupguard_guard.queries - before
        result[name] = out
    if guard is not None:
        result["guard"] = {"queries": guard._dupguard_guard.queries, "skipped_runs": guard._dupguard_guard.skipped_runs}
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


def partitioned_race(sp: Any, schedulers: tuple[Any, Any], scenario: str, partition_key: str) -> dict[str, Any]:
    """serial: B creates its run after A committed. overlap: B creates its run while A's is uncommitted.

    Both schedulers first read the pending partition row (the race), as scenarios_partitioned does.
    """
    from airflow.serialization.definitions.dag import SerializedDAG

    a, b = schedulers
    before = {r["id"] for r in run_rows(sp.CONSUMER)}
    out: dict[str, Any] = {"race_event_id": sp.produce_event(partition_key), "apdr_read": {}}
    both_read = threading.Barrier(2, timeout=60)
    a_committed, a_created, b_created = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []
    original_create = SerializedDAG.create_dagrun

    def create_dagrun(self: Any, *c_args: Any, **c_kwargs: Any) -> Any:
        name = threading.current_thread().name
        if scenario == "partitioned-overlap" and name == "scheduler-b":
            a_created.wait(60)  # A's run exists (uncommitted) before B creates its own
        run = original_create(self, *c_args, **c_kwargs)
        if name == "scheduler-a":
            a_created.set()
            if scenario == "partitioned-overlap":
                b_created.wait(60)  # A commits only after B created its run and task instances
        elif name == "scheduler-b":
            b_created.set()
        return run

    def after_read(name: str) -> Any:
        def wait(apdr_ids: list[int]) -> None:
            out["apdr_read"][name] = apdr_ids
            both_read.wait()
            if scenario == "partitioned-serial" and name == "scheduler-b":
                a_committed.wait(60)

        return wait

    def work(runner: Any, name: str) -> None:
        try:
            sp.scheduler_loop(runner, after_apdr_read=after_read(name))
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            errors.append(err)
            both_read.abort()
            a_created.set()
            b_created.set()
        finally:
            if name == "scheduler-a":
                a_committed.set()

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
    if errors:
        raise errors[0]
    out["runs"] = [r for r in run_rows(sp.CONSUMER) if r["id"] not in before]
    out["apdr_pointers"] = {str(k): v for k, v in sp.apdr_pointers().items()}
    return out


PARTITIONED_SCENARIOS = {"partitioned-serial": "2026-11-30T05:00:00", "partitioned-overlap": "2026-11-30T06:00:00"}


def run_partitioned_scenarios(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import scenarios_partitioned as sp

    dags = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    (dags / "partitioned_sales.py").write_text(sp.dag_file_source([sp.CONSUMER]))
    guard = loaded_guard()
    result["policy"] = policy_facts(guard)
    sp.serialize_dags()
    sp.check_unpaused([sp.PRODUCER, sp.CONSUMER])
    schedulers = (sp.new_scheduler("scheduler-a"), sp.new_scheduler("scheduler-b"))
    result["job_ids"] = {"scheduler-a": schedulers[0].job.id, "scheduler-b": schedulers[1].job.id}
    sp.produce_event("2026-11-30T04:00:00")
    sp.scheduler_loop(schedulers[0])  # an ordinary, undisturbed run first
    result["ordinary_runs"] = run_rows(sp.CONSUMER)
    for name in args.scenarios:
        before = guard._dupguard_guard.queries if guard else 0
        out = partitioned_race(sp, schedulers, name, PARTITIONED_SCENARIOS[name])
        if guard is not None:
            out["guard_queries"] = guard._dupguard_guard.queries - before
        result[name] = out
    if guard is not None:
        result["guard"] = {"queries": guard._dupguard_guard.queries, "skipped_runs": guard._dupguard_guard.skipped_runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scenarios",
        required=True,
        type=lambda text: text.split(","),
        help=f"comma-separated: {', '.join([*ASSET_SCENARIOS, *PARTITIONED_SCENARIOS])}",
    )
    parser.add_argument("--mode", required=True, choices=["none", "local-settings", "entry-point"])
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

"""Cost of the in-scheduler guard on Airflow's scheduler: run creation with and without it.

Three configurations of one real Airflow (default 3.1.2), each in its own process and database
(migrated by that Airflow): ``none`` (no policy: Airflow bulk-inserts task instances as mappings),
``noop-hook`` (an airflow_local_settings.py whose task_instance_mutation_hook does nothing: what
*any* mutation hook costs, because Airflow then builds TaskInstance objects and calls the hook for
each), and ``guard`` (``dupguard guard print-local-settings``).

Workload: ``--consumers`` asset-scheduled DAGs (default 50: 5 assets x 10 consumers, 5 tasks each,
3 of them a literal-mapped task), one event per asset per round, then Airflow's own
``SchedulerJobRunner._create_dagruns_for_dags`` is called (one call = the run-creation step of one
scheduler loop, ``max_dagruns_to_create_per_loop`` = 10 runs) until every DAG has its run; each call
is timed. Also timed: ``TaskInstance.refresh_from_task`` on existing task instances, which the
scheduler calls for task instances it schedules and which calls the hook (the guard returns at
once for them). Rounds default to 10 (below max_active_runs = 16).

``guard-before`` (with ``--before REV``) is the guard as of git revision REV, for before/after
figures. ``--no-row-locking`` runs Airflow with ``[scheduler] use_row_level_locking = False`` (the
guard then takes its per-DAG advisory lock). ``--partitioned`` (Airflow 3.2) makes the consumers
partitioned (``PartitionedAssetTimetable``, IdentityMapper) and each round's events carry a new
partition key: the guard's 3.2 path, with its (dag, key) advisory lock, on every run.

    .venv/bin/python -m benchmarks.guard_cost [--version 3.1.2] [--consumers 50] [--rounds 10] [--repeat 3]
        [--before 3c63296] [--no-row-locking] [--partitioned] [--out NAME]

Prints a table and writes benchmarks/results/<NAME>.json (default guard_cost). Needs the test
PostgreSQL (scripts/postgres.sh start) and .airflow-venvs/<version>.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MODES = ("none", "noop-hook", "guard-before", "guard")
NOOP_HOOK = "def task_instance_mutation_hook(task_instance):\n    pass\n"
ASSETS = 5


def partitioned_dag_file(consumers: int) -> str:
    lines = [
        "from airflow.sdk import DAG, Asset, BaseOperator, IdentityMapper, PartitionedAssetTimetable",
        "class Noop(BaseOperator):",
        "    def execute(self, context):",
        "        return None",
    ]
    for a in range(ASSETS):
        lines += [
            f"a{a} = Asset(name='bench_{a}')",
            f"with DAG('producer_{a}', schedule=None, catchup=False):",
            f"    Noop(task_id='write', outlets=[a{a}])",
        ]
    for c in range(consumers):
        lines += [
            f"with DAG('consumer_{c:03d}', catchup=False, schedule=PartitionedAssetTimetable(",
            f"        assets=a{c % ASSETS}, default_partition_mapper=IdentityMapper())):",
            "    fan = Noop.partial(task_id='fan').expand_kwargs([{}, {}, {}])",
            "    Noop(task_id='extract') >> fan >> Noop(task_id='load')",
        ]
    return "\n".join(lines) + "\n"


def dag_file(consumers: int) -> str:
    lines = [
        "from datetime import datetime",
        "from airflow.providers.standard.operators.empty import EmptyOperator",
        "from airflow.providers.standard.operators.python import PythonOperator",
        "from airflow.sdk import DAG, Asset",
        "START = datetime(2026, 1, 1)",
    ]
    for a in range(ASSETS):
        lines += [
            f"a{a} = Asset(name='bench_{a}', uri='s3://bench/{a}')",
            f"with DAG('producer_{a}', schedule=None, start_date=START, catchup=False):",
            f"    EmptyOperator(task_id='publish', outlets=[a{a}])",
        ]
    for c in range(consumers):
        lines += [
            f"with DAG('consumer_{c:03d}', schedule=[a{c % ASSETS}], start_date=START, catchup=False):",
            "    fan = PythonOperator.partial(task_id='fan', python_callable=print).expand(op_args=[[1], [2], [3]])",
            "    EmptyOperator(task_id='extract') >> fan >> EmptyOperator(task_id='load')",
        ]
    return "\n".join(lines) + "\n"


# Worker: runs inside the Airflow venv -------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    home = Path(tempfile.mkdtemp(prefix="dupguard-guard-bench-"))
    try:
        (home / "dags").mkdir()
        (home / "config").mkdir()
        os.environ.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": args.db_url.replace("postgresql://", "postgresql+psycopg2://"),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "ERROR",
                "AIRFLOW__SCHEDULER__USE_ROW_LEVEL_LOCKING": "False" if args.no_row_locking else "True",
            }
        )
        if args.mode == "noop-hook":
            (home / "config" / "airflow_local_settings.py").write_text(NOOP_HOOK)
        elif args.mode == "guard":
            shutil.copyfile(args.snippet, home / "config" / "airflow_local_settings.py")
        elif args.mode == "guard-before":
            shutil.copyfile(args.before_snippet, home / "config" / "airflow_local_settings.py")
        sys.path.insert(0, str(ROOT / "scripts" / "airflow"))
        import scenarios_asset

        af = scenarios_asset.AF()
        if args.partitioned:
            import scenarios_partitioned as sp

            (home / "dags" / "bench.py").write_text(partitioned_dag_file(args.consumers))
            sp.serialize_dags()
            runner = sp.new_scheduler("bench-scheduler")
        else:
            (home / "dags" / "bench.py").write_text(dag_file(args.consumers))
            af.sync_dags(home / "dags")
            runner = af.new_scheduler("bench-scheduler")
        in_guard = time_guard_calls()
        calls: list[dict[str, float]] = []
        for round_no in range(args.rounds):
            for a in range(ASSETS):
                if args.partitioned:
                    sp.produce_event(
                        f"2026-11-30T{round_no:02d}:00:00", producer=f"producer_{a}", asset_name=f"bench_{a}"
                    )
                else:
                    af.emit(f"producer_{a}", f"bench_{a}")
            while True:
                before = count_runs(af)
                started = time.perf_counter()
                if args.partitioned:
                    sp.scheduler_loop(runner)
                else:
                    af.create_runs(runner)
                elapsed = time.perf_counter() - started
                made = count_runs(af) - before
                if made == 0:
                    break
                calls.append({"seconds": elapsed, "runs": made})
        refresh = time_refresh_from_task(af)
        guard = sys.modules.get("airflow_local_settings")
        state = getattr(guard, "_dupguard_guard", None)
        out = {
            "mode": args.mode,
            "airflow_version": af.version,
            "calls": calls,
            "refresh_from_task_us": refresh,
            "guard_queries": getattr(state, "queries", None),
            "guard_seconds_in_hook": in_guard["seconds"] if state is not None else None,
            "guard_calls": in_guard["calls"] if state is not None else None,
            "guard_skipped_runs": getattr(state, "skipped_runs", None),
            "guard_lock_waits": getattr(state, "lock_waits", None),
        }
        Path(args.out).write_text(json.dumps(out))
    finally:
        shutil.rmtree(home, ignore_errors=True)


def time_guard_calls() -> dict[str, float]:
    """Wrap the loaded guard's hook body with a timer: the guard's own time inside the scheduler."""
    totals = {"seconds": 0.0, "calls": 0}
    guard = getattr(sys.modules.get("airflow_local_settings"), "_dupguard_guard", None)
    if guard is None:
        return totals
    body = guard.mutate

    def timed(task_instance: Any) -> None:
        started = time.perf_counter()
        try:
            body(task_instance)
        finally:
            totals["seconds"] += time.perf_counter() - started
            totals["calls"] += 1

    guard.mutate = timed
    return totals


def count_runs(af: Any) -> int:
    with af.create_session() as session:
        return int(session.query(af.DagRun).filter(af.DagRun.run_type == "asset_triggered").count())


def time_refresh_from_task(af: Any, limit: int = 500, repeat: int = 20) -> float:
    """Microseconds per TaskInstance.refresh_from_task on existing task instances of asset runs."""
    from airflow.models.serialized_dag import SerializedDagModel

    with af.create_session() as session:
        tis = session.query(af.TaskInstance).filter(af.TaskInstance.run_id.like("asset_triggered__%")).limit(limit)
        tis = tis.all()
        dags: dict[str, Any] = {}
        for ti in tis:
            if ti.dag_id not in dags:
                dags[ti.dag_id] = SerializedDagModel.get(ti.dag_id, session=session).dag
        pairs = [(ti, dags[ti.dag_id].get_task(ti.task_id)) for ti in tis]
        started = time.perf_counter()
        for _ in range(repeat):
            for ti, task in pairs:
                ti.refresh_from_task(task)
        elapsed = time.perf_counter() - started
        session.rollback()
    return elapsed / (repeat * len(pairs)) * 1e6


# Orchestrator: runs in the repo venv --------------------------------------------------------------


def admin(sql: str) -> None:
    from tests.pg import execute_admin

    execute_admin(sql)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="3.1.2")
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="fresh databases per mode, interleaved")
    parser.add_argument("--before", metavar="REV", help="also measure the guard as of this git revision")
    parser.add_argument("--no-row-locking", action="store_true", help="[scheduler] use_row_level_locking = False")
    parser.add_argument("--partitioned", action="store_true", help="partitioned consumers (Airflow 3.2)")
    parser.add_argument("--name", default="guard_cost", help="results file name (benchmarks/results/NAME.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--db-url", help=argparse.SUPPRESS)
    parser.add_argument("--snippet", help=argparse.SUPPRESS)
    parser.add_argument("--before-snippet", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    from detector.app.guard_cli import print_local_settings
    from tests.pg import admin_url, database_url

    python = ROOT / ".airflow-venvs" / args.version / "bin" / "python"
    if not python.is_file():
        sys.exit(f"{python} missing: run scripts/airflow/venv.sh {args.version}")
    admin_url()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHON", "VIRTUAL_ENV"))}
    work = Path(tempfile.mkdtemp(prefix="dupguard-guard-bench-"))
    snippet = work / "airflow_local_settings.py"
    snippet.write_text(print_local_settings())
    before_snippet = work / "airflow_local_settings_before.py"
    modes = [m for m in MODES if m != "guard-before" or args.before]
    if args.before:
        show = ["git", "-C", str(ROOT), "show", f"{args.before}:detector/guard/policy.py"]
        before_snippet.write_text(subprocess.run(show, check=True, capture_output=True, text=True).stdout)
    template = f"guard_bench_tpl_{uuid.uuid4().hex[:6]}"
    databases = [template]
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        admin(f'CREATE DATABASE "{template}"')
        migrate_env = {
            **env,
            "AIRFLOW_HOME": str(work / "migrate"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url(template).replace(
                "postgresql://", "postgresql+psycopg2://"
            ),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        }
        migrate = [str(python), "-m", "airflow", "db", "migrate"]
        subprocess.run(migrate, env=migrate_env, check=True, capture_output=True)
        for attempt in range(args.repeat):
            for mode in modes:
                db = f"guard_bench_{uuid.uuid4().hex[:8]}"
                admin(f'CREATE DATABASE "{db}" TEMPLATE "{template}"')
                databases.append(db)
                out = work / f"{mode}-{attempt}.json"
                cmd = [str(python), str(Path(__file__).resolve()), "--worker", "--mode", mode]
                cmd += ["--db-url", database_url(db), "--snippet", str(snippet), "--out", str(out)]
                cmd += ["--before-snippet", str(before_snippet)]
                cmd += ["--consumers", str(args.consumers), "--rounds", str(args.rounds)]
                cmd += ["--no-row-locking"] * args.no_row_locking + ["--partitioned"] * args.partitioned
                subprocess.run(cmd, env=env, check=True, cwd=ROOT)
                results.setdefault(mode, []).append(json.loads(out.read_text()))
    finally:
        for db in databases:
            admin(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)

    summary = report(results, args)
    from benchmarks.provenance import provenance  # here: the worker runs as a script in Airflow's venv

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(
        json.dumps({"summary": summary, "provenance": provenance(), "raw": results}, indent=2) + "\n"
    )


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "airflow_version": args.version,
        "consumers": args.consumers,
        "rounds": args.rounds,
        "repeat": args.repeat,
        "host_cpus": os.cpu_count(),
        "host_load_1min": round(os.getloadavg()[0], 2),
        "before": args.before,
        "use_row_level_locking": not args.no_row_locking,
        "partitioned": args.partitioned,
    }
    print(
        f"Airflow {args.version}, {args.consumers} asset-scheduled DAGs (5 TIs per run), {args.rounds} rounds "
        f"x {args.repeat} fresh databases per mode; _create_dagruns_for_dags calls of up to 10 runs"
        + (" (partitioned)" if args.partitioned else "")
        + (" (use_row_level_locking = False)" if args.no_row_locking else "")
    )
    header = (
        f"{'mode':<12} {'calls':>5} {'runs':>5} {'median ms/call':>14} {'p90 ms/call':>11} {'ms/run':>7} "
        f"{'refresh_from_task us':>20} {'queries':>7} {'in guard ms/run':>15}"
    )
    print(header)
    for mode in (m for m in MODES if m in results):
        attempts = results[mode]
        per_call = sorted(c["seconds"] * 1000 for r in attempts for c in r["calls"])
        runs = sum(c["runs"] for r in attempts for c in r["calls"])
        in_guard = [r["guard_seconds_in_hook"] for r in attempts if r.get("guard_seconds_in_hook") is not None]
        row = {
            "calls": len(per_call),
            "runs": runs,
            "median_ms_per_call": round(statistics.median(per_call), 2),
            "p90_ms_per_call": round(per_call[int(0.9 * (len(per_call) - 1))], 2),
            "ms_per_run": round(sum(per_call) / runs, 3),
            "refresh_from_task_us": round(statistics.median(r["refresh_from_task_us"] for r in attempts), 2),
            "guard_queries": sum(r["guard_queries"] or 0 for r in attempts) if in_guard else None,
            "in_guard_ms_per_run": round(sum(in_guard) * 1000 / runs, 3) if in_guard else None,
        }
        summary[mode] = row
        print(
            f"{mode:<12} {row['calls']:>5} {runs:>5} {row['median_ms_per_call']:>14} {row['p90_ms_per_call']:>11} "
            f"{row['ms_per_run']:>7} {row['refresh_from_task_us']:>20} {row['guard_queries']!s:>7} "
            f"{row['in_guard_ms_per_run']!s:>15}"
        )
    return summary


if __name__ == "__main__":
    main()

"""What one idle poll costs, statement by statement: client CPU and PostgreSQL backend CPU per call.

Before it was measured here, at a 10 ms poll the daemon spent ~0.55 ms of its own CPU and ~0.4 ms of its backend's CPU
per idle poll, while the executor needs ~0.02 ms (pg_stat_statements). A profile of the backend
(``perf record`` on it, benchmarks/results/measurements.md) puts two thirds of its time in parse, analysis and
planning of a statement sent as fresh text every poll. This benchmark measures the candidates side by
side, on one long-lived autocommit connection made by ``detector.metadb.engine.make_engine`` (the
daemon's wait callback and deadline included), against the real Airflow 3.1.2 schema with a history:

- ``core_new_runs``: the full poll statement (``dag_runs.new_runs``) through SQLAlchemy Core (before);
- ``core_max_id``: ``SELECT max(id) FROM dag_run`` through SQLAlchemy Core: a cheaper probe, still
  parsed and planned every call;
- ``raw_max_id``: the same text on the driver's own cursor (no SQLAlchemy execution path);
- ``prepared_max_id``: the probe as a server-side prepared statement (``PREPARE`` once, ``EXECUTE``
  per call) on the driver's own cursor: what the daemon now sends;
- ``prepared_max_id_sa``: the same ``EXECUTE`` through SQLAlchemy (``exec_driver_sql``);
- ``prepared_new_runs``: the full poll statement prepared (with its two parameters).

CPU: client = ``time.process_time()`` of this process (single thread), backend = utime+stime of the
connection's backend from /proc (same machine). Variants are interleaved over ``--repeats`` rounds;
the median over rounds is reported with the spread and the load average.

    .venv/bin/python -m benchmarks.poll_probe [--calls 3000] [--repeats 5] [--runs 20000]

Needs ``DUPGUARD_TEST_DATABASE_URL`` (e.g. ``scripts/postgres.sh start``); creates and drops its own
database ``dupguard_poll_probe``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql

from benchmarks.detection_latency import admin, cpu_seconds, fresh_db
from benchmarks.provenance import provenance
from detector.metadb import dag_runs
from detector.metadb.engine import make_engine, open_airflow_db, parse_url

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
NAME = "dupguard_poll_probe"


def fill(db_url: str, runs: int) -> None:
    """``runs`` finished asset runs with their events (set-based), then ANALYZE: statistics as in production."""
    admin(db_url, db=NAME, sql=(
        "INSERT INTO job (id, job_type, state, hostname) VALUES (1, 'SchedulerJob', 'running', 'sched-a') "
        "ON CONFLICT DO NOTHING;"
        "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, queued_at, creating_job_id, "
        "triggered_by, conf, clear_number, span_status) "
        f"SELECT 'dag_' || (g % 300), 'r' || g, 'asset_triggered', now() - g * interval '1 minute', 'success', "
        f"now() - g * interval '1 minute', 1, 'ASSET', '{{}}', 0, 'ended' FROM generate_series(1, {runs}) g;"
        "ANALYZE;"
    ))  # fmt: skip


def variants(conn: Connection, t: Any, high: int) -> dict[str, Callable[[], object]]:
    raw = conn.connection.dbapi_connection
    assert raw is not None
    cur = raw.cursor()
    probe_sql = str(dag_runs.top_run_id_statement(t).compile(dialect=conn.dialect))
    dollar = postgresql.psycopg2.dialect(paramstyle="numeric_dollar")  # type: ignore[attr-defined]
    prepared_new = str(dag_runs._new_runs_statement(t, False).compile(dialect=dollar))
    cur.execute(f"PREPARE bench_probe AS {probe_sql}")
    cur.execute(f"PREPARE bench_new_runs AS {prepared_new}")

    def raw_probe() -> object:
        cur.execute(probe_sql)
        return cur.fetchone()

    def prepared_probe() -> object:
        cur.execute("EXECUTE bench_probe")
        return cur.fetchone()

    def prepared_new_runs() -> object:
        cur.execute("EXECUTE bench_new_runs (%s, %s)", (high, 1000))
        return cur.fetchall()

    return {
        "core_new_runs": lambda: dag_runs.new_runs(conn, t, high, [], 1000),
        "core_max_id": lambda: dag_runs.max_run_id(conn, t),
        "raw_max_id": raw_probe,
        "prepared_max_id": prepared_probe,
        "prepared_max_id_sa": lambda: conn.exec_driver_sql("EXECUTE bench_probe").scalar(),
        "prepared_new_runs": prepared_new_runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20000, help="history size (dag_run rows)")
    parser.add_argument("--tag", default=time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    args = parser.parse_args()
    url = os.environ["DUPGUARD_TEST_DATABASE_URL"]
    db_url = fresh_db(url, NAME)
    fill(db_url, args.runs)
    engine = make_engine(parse_url(db_url), call_timeout=10.0)
    db = open_airflow_db(engine)
    rounds: list[dict[str, Any]] = []
    try:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            backend = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
            high = dag_runs.max_run_id(conn, db.tables)
            calls = variants(conn, db.tables, high)
            for fn in calls.values():  # warm: caches, and PostgreSQL's choice of a generic plan (after 5)
                for _ in range(50):
                    fn()
            for n in range(args.repeats):
                row: dict[str, Any] = {"round": n, "load": round(os.getloadavg()[0], 2)}
                for name, fn in calls.items():
                    c0, b0, w0 = time.process_time(), cpu_seconds(backend), time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    w1, b1, c1 = time.perf_counter(), cpu_seconds(backend), time.process_time()
                    row[name] = {
                        "client_cpu_us": round(1e6 * (c1 - c0) / args.calls, 1),
                        "backend_cpu_us": round(1e6 * (b1 - b0) / args.calls, 1),
                        "wall_us": round(1e6 * (w1 - w0) / args.calls, 1),
                    }
                rounds.append(row)
                print(json.dumps(row), flush=True)
            plans = {
                name: [r[0] for r in conn.exec_driver_sql(f"EXPLAIN EXECUTE {stmt}").all()]
                for name, stmt in (("probe", "bench_probe"), ("new_runs", f"bench_new_runs ({high}, 1000)"))
            }
            generic = {r[0]: r[1] for r in conn.exec_driver_sql(
                "SELECT name, generic_plans FROM pg_prepared_statements").all()}  # fmt: skip
    finally:
        engine.dispose()
        admin(url, f"DROP DATABASE IF EXISTS {NAME} WITH (FORCE)")
    names = [k for k in rounds[0] if k not in ("round", "load")]
    summary = {
        name: {
            metric: {
                "median": statistics.median(r[name][metric] for r in rounds),
                "min": min(r[name][metric] for r in rounds),
                "max": max(r[name][metric] for r in rounds),
            }
            for metric in ("client_cpu_us", "backend_cpu_us", "wall_us")
        }
        for name in names
    }
    loads = [r["load"] for r in rounds]
    meta = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpus": os.cpu_count(), "args": vars(args)}
    meta["provenance"] = provenance()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"poll_probe-{args.tag}.json"
    out.write_text(json.dumps({"meta": meta, "rounds": rounds, "summary": summary, "plans": plans,
                               "generic_plans": generic}, indent=1) + "\n")  # fmt: skip
    print(f"\nper call, median (min to max) over {args.repeats} rounds of {args.calls}; load {min(loads)}-{max(loads)}")
    print("| statement | client CPU µs | backend CPU µs | wall µs |")
    print("| --- | --- | --- | --- |")
    for name, m in summary.items():
        cells = [f"{m[k]['median']:g} ({m[k]['min']:g} to {m[k]['max']:g})" for k in ("client_cpu_us", "backend_cpu_us",
                                                                                    "wall_us")]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"generic plans used: {generic}")
    print(f"raw: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

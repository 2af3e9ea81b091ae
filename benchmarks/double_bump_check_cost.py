"""Cost of the double_bump check (docs/explanation/checks.md) at ``--sizes`` rows of ``task_instance``.

Two paths (``detector.checks.double_bump.check``): the **live** run of ``dupguard run`` reads the
in-flight TIs (``ti_state``), looks up the ones at try >= 2 in ``task_instance_history``
(``task_instance_history_dtrt_uq``) and, for those missing a try, the scheduler jobs and the archive
tables; **scan** reads every TI at try >= 2 once (no index on try_number: a sequential scan) with a
per-candidate count on the history's unique key. Only the indexes Airflow ships (the 3.1.2 schema,
tests/fixtures/schema/airflow-3.1.2.sql).

History: 10 TIs per run, 500 DAGs; every TI succeeded, 2 % at try 2 with their try-1 history row
(retries); the newest 20 runs are in flight (200 TIs scheduled/queued/running, 20 of them at try 2
after a retry); 5 in-flight TIs and 5 finished ones bumped (try 2, no history row). Indexes, keys and
FKs are dropped for the load, the task instances are written in chunks on two connections, and the
keys and indexes are re-created after it, two at a time (their time is in ``build_seconds``; the FKs
are not: no statement timed here reads them). Written this way a 100M-row table builds in about an
hour on two cores; inserted into live indexes it took 1,146 s at 10M and grows faster than the rows.
``VACUUM ANALYZE`` before timing; the live figure is the second run (the first one fills the memory).

    .venv/bin/python benchmarks/double_bump_check_cost.py --sizes 1m,10m,100m --repeat 7
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.history import admin_url, connect, machine  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.checks.double_bump import statements  # noqa: E402
from detector.checks.double_bump.check import DoubleBumpCheck  # noqa: E402
from detector.checks.double_bump.statements import bump_tables  # noqa: E402
from detector.config import Config  # noqa: E402
from detector.core.checks import CheckContext  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from detector.metrics import Metrics  # noqa: E402
from tests.pg import fixture_sql  # noqa: E402

SCHEMA = ROOT / "tests" / "fixtures" / "schema" / "airflow-3.1.2.sql"
RESULTS = ROOT / "benchmarks" / "results"
COUNTS = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000, "100m": 100_000_000}
CHUNK_RUNS = 500_000  # task instances are written 5M at a time, two chunks at once
# scan's own default (60 s) is too short for the scan at 100M rows on this machine: measured here
# without a deadline worth the name, and what `dupguard scan` then does is in benchmarks/results/measurements.md
CALL_TIMEOUT = 3600.0
SESSION = "SET maintenance_work_mem = '2GB'; SET max_parallel_maintenance_workers = 0"
TABLES = ("task_instance", "task_instance_history", "dag_run", "job")
RUNS = """
INSERT INTO job (id, state, job_type, latest_heartbeat, hostname)
VALUES (1, 'running', 'SchedulerJob', now(), 'scheduler-a'), (2, 'running', 'SchedulerJob', now(), 'scheduler-b');
INSERT INTO dag_run (id, dag_id, run_id, run_type, run_after, state, queued_at, clear_number, span_status)
SELECT r, 'dag_' || r %% 500, 'run_' || r, 'scheduled', timestamptz '2025-01-01' + (r || ' minutes')::interval,
       CASE WHEN r >= %(runs)s - 20 THEN 'running' ELSE 'success' END,
       timestamptz '2025-01-01' + (r || ' minutes')::interval, 0, 'not_started'
FROM generate_series(0, %(runs)s - 1) AS r;
"""
# TI (r, t): try 2 after a retry when (r * 10 + t) %% 50 = 7 (2 %%); in flight in the newest 20 runs
TASK_INSTANCES = """
INSERT INTO task_instance (id, task_id, dag_id, run_id, map_index, state, try_number, pool, pool_slots,
                           hostname, queued_by_job_id, scheduled_dttm, start_date, dag_version_id, span_status)
SELECT md5(r || '-' || t)::uuid, 'task_' || t, 'dag_' || r %% 500, 'run_' || r, -1,
       CASE WHEN r < %(runs)s - 20 THEN 'success' ELSE (ARRAY['scheduled', 'queued', 'running'])[1 + t %% 3] END,
       CASE WHEN (r * 10 + t) %% 50 = 7 OR (r >= %(runs)s - 20 AND t = 7) THEN 2 ELSE 1 END,
       'default_pool', 1, 'worker-' || t, 1 + t %% 2, x.at, x.at, '00000000-0000-0000-0000-000000000001', 'not_started'
FROM generate_series(%(first)s, %(last)s) AS r, generate_series(0, 9) AS t,
     LATERAL (SELECT timestamptz '2025-01-01' + (r || ' minutes')::interval) AS x(at);
"""
HISTORY = """
INSERT INTO task_instance_history (task_instance_id, task_id, dag_id, run_id, map_index, try_number, state,
                                   pool, pool_slots, span_status)
SELECT md5(ti.id::text)::uuid, ti.task_id, ti.dag_id, ti.run_id, -1, 1, 'failed', 'default_pool', 1, 'not_started'
FROM task_instance ti WHERE ti.try_number = 2;
"""
# the bumps: 5 in flight, 5 finished, each try 2 with no history row for try 1
BUMPS = """
DELETE FROM task_instance_history h USING (
    SELECT r FROM generate_series(%(runs)s - 5, %(runs)s - 1) AS r
    UNION ALL SELECT r * 50 FROM generate_series(1, 5) AS r) b
WHERE h.dag_id = 'dag_' || b.r %% 500 AND h.run_id = 'run_' || b.r AND h.task_id = 'task_7';
UPDATE task_instance SET try_number = 2 WHERE (dag_id, task_id, run_id) IN (
    SELECT 'dag_' || (r * 50) %% 500, 'task_7', 'run_' || (r * 50) FROM generate_series(1, 5) AS r);
"""


def _indexes(cur: Any) -> list[str]:
    cur.execute(
        "SELECT indexdef FROM pg_indexes WHERE tablename = ANY(%s) AND indexname NOT IN "
        "(SELECT conname FROM pg_constraint WHERE contype IN ('p', 'u'))",
        (list(TABLES),),
    )
    return [r[0] for r in cur.fetchall()]


def _keys(cur: Any) -> list[tuple[str, str, str]]:
    """(table, name, definition) of the primary keys and unique constraints of TABLES."""
    cur.execute(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE contype IN ('p', 'u') AND conrelid::regclass::text = ANY(%s)",
        (list(TABLES),),
    )
    return [tuple(r) for r in cur.fetchall()]


def _run_parallel(name: str, statements: list[tuple[str, dict[str, Any]]]) -> None:
    """Each statement in its own autocommit connection, two at a time (the machine has two cores)."""

    def one(item: tuple[str, dict[str, Any]]) -> None:
        conn = connect(name)
        try:
            with conn.cursor() as cur:
                cur.execute(SESSION)
                cur.execute(*item)
        finally:
            conn.close()

    with ThreadPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        list(pool.map(one, statements))


def build(size: str) -> str:
    n = COUNTS[size]
    runs = n // 10
    name = f"dupguard_bench_bump_{size}"
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(fixture_sql(SCHEMA))
        cur.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f' "
            "AND (conrelid::regclass::text = ANY(%s) OR confrelid::regclass::text = ANY(%s))",
            (list(TABLES), list(TABLES)),
        )
        for table, fk in cur.fetchall():
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{fk}"')
        indexes = _indexes(cur)
        for ddl in indexes:
            cur.execute(f"DROP INDEX {ddl.split(' ON ')[0].split()[-1]}")
        keys = _keys(cur)
        for table, key, _ in keys:
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{key}"')
        cur.execute(RUNS, {"runs": runs})
    conn.close()
    chunks = [
        (TASK_INSTANCES, {"runs": runs, "first": first, "last": min(first + CHUNK_RUNS, runs) - 1})
        for first in range(0, runs, CHUNK_RUNS)
    ]
    _run_parallel(name, chunks)
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(HISTORY)
    conn.close()
    # task_instance's first (the big ones), so that the two connections end together
    ddls = [f'ALTER TABLE {t} ADD CONSTRAINT "{k}" {d}' for t, k, d in keys] + indexes
    ddls.sort(key=lambda d: not re.search(r"[ .]task_instance ", d))
    _run_parallel(name, [(d, {}) for d in ddls])
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(BUMPS, {"runs": runs})
        for table in TABLES:
            cur.execute(f"VACUUM ANALYZE {table}")
    conn.close()
    url: str = admin_url().rsplit("/", 1)[0] + "/" + name
    return url


def _timed(check: DoubleBumpCheck, url: str, live: bool, repeat: int) -> tuple[list[float], list[float], list[Any]]:
    """Wall time and this process's CPU time of each ``collect`` (the machine is shared: wall time
    includes waiting for a core; the CPU time is dupguard's own share)."""
    db = open_airflow_db(make_engine(parse_url(url), call_timeout=CALL_TIMEOUT))
    times: list[float] = []
    cpu: list[float] = []
    found: list[Any] = []
    with db.engine.connect() as conn:
        for _ in range(repeat):
            now = datetime.now(UTC)
            start, cpu_start = time.perf_counter(), time.process_time()
            found = check.collect(conn, db, CheckContext(db_now=now, now=now, live=live))
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - cpu_start)
            conn.rollback()
    db.engine.dispose()
    return times, cpu, found


def _server_ms(url: str) -> dict[str, float]:
    """PostgreSQL's own execution time of the two statements that read task_instance (EXPLAIN ANALYZE)."""
    bt, out = bump_tables(), {}
    reads = {
        "in_flight": statements.in_flight_statement(bt),
        "scan": statements.tis_missing_history_statement(bt, None),
    }
    engine = make_engine(parse_url(url), call_timeout=CALL_TIMEOUT)
    with engine.connect() as conn:
        for name, stmt in reads.items():
            sql = str(stmt.compile(conn, compile_kwargs={"literal_binds": True}))
            plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) " + sql).scalar_one()
            out[name] = round(float(plan[0]["Execution Time"]), 2)
    engine.dispose()
    return out


def _ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 2)


def measure(url: str, repeat: int) -> dict[str, Any]:
    live = DoubleBumpCheck(Config.of(database_url=url), Metrics())
    _timed(live, url, True, 1)  # fills the memory, as the daemon's first run does
    live_times, live_cpu, live_found = _timed(live, url, True, repeat)
    scan = DoubleBumpCheck(Config.of(database_url=url), Metrics())
    scan_times, scan_cpu, scan_found = _timed(scan, url, False, max(1, repeat // 2))
    engine = make_engine(parse_url(url))
    with engine.connect() as conn:
        sizes = {t: conn.exec_driver_sql(f"SELECT pg_total_relation_size('{t}')").scalar_one() for t in TABLES}
    engine.dispose()
    return {
        "table_bytes": sizes,
        "live_ms": _ms(live_times),
        "live_ms_all": [round(t * 1000, 2) for t in live_times],
        "live_cpu_ms": _ms(live_cpu),
        "live_found": sorted((o.confidence, o.facts["run_id"]) for o in live_found),
        "scan_ms": _ms(scan_times),
        "scan_ms_all": [round(t * 1000, 2) for t in scan_times],
        "scan_cpu_ms": _ms(scan_cpu),
        "scan_found": len(scan_found),
        "server_ms": _server_ms(url),
        "bumps_built": {"in_flight": 5, "finished": 5},
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--reuse", action="store_true", help="measure the databases a previous run built")
    parser.add_argument("--out", default="double_bump_check_cost.json", help="file name under benchmarks/results/")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"provenance": provenance(), "machine": machine(), "repeat": args.repeat, "sizes": {}}
    sizes = [s.strip().lower() for s in args.sizes.split(",") if s.strip()]
    if unknown := [s for s in sizes if s not in COUNTS]:
        parser.error(f"unknown size(s) {unknown}; choose from {','.join(COUNTS)}")
    for size in sizes:
        started = time.monotonic()
        url = admin_url().rsplit("/", 1)[0] + f"/dupguard_bench_bump_{size}" if args.reuse else build(size)
        built = None if args.reuse else round(time.monotonic() - started, 1)
        out["sizes"][size] = measure(url, args.repeat) | {"build_seconds": built}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

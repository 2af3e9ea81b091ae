"""Cost of the stranded-events check (docs/explanation/checks.md) at ``--sizes`` rows of ``asset_event``.

The check is one statement (``statements.stranded_event_candidates``): per schedule reference of an
unpaused asset-scheduled DAG without a queue row and with an asset-triggered run, the run that
consumed the asset's newest consumed event (``idx_asset_id_timestamp`` walked backwards,
``idx_dagrun_asset_events_event_id``), then the asset's events after that run's run_after and
whether a run of the DAG consumed them. Only the indexes Airflow ships (the 3.3.2 schema,
tests/fixtures/schema/airflow-3.3.2.sql).

History: 200 assets, 300 consumer DAGs (DAG d on asset d % 200), one event per second round the
assets; each DAG's runs consume 10 of its asset's events each (1.5 ``dagrun_asset_event`` rows per
event); 20 DAGs have a queue row and 2 waiting events (normal); 3 DAGs have 2 stranded events each
(newer than their latest run, which was created after them, no queue row); 20 more DAGs on those
assets never ran; 3 more DAGs have an event committed late (inside their latest run's window,
consumed by no run: ``statements.stranded_late_candidates``, timed on its own as ``late_ms``). FKs of the
loaded tables are dropped for the load and not re-added (the planner
does not use them here). ``VACUUM ANALYZE`` before timing.

    .venv/bin/python benchmarks/stranded_check_cost.py --sizes 1m,10m --repeat 7 --out stranded_check_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.history import admin_url, connect, machine, parse_sizes  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.checks.stranded_events import statements  # noqa: E402
from detector.checks.stranded_events.rule import find_stranded  # noqa: E402
from detector.checks.stranded_events.rule_late import find_late  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from tests.pg import fixture_sql  # noqa: E402

SCHEMA = ROOT / "tests" / "fixtures" / "schema" / "airflow-3.3.2.sql"
RESULTS = ROOT / "benchmarks" / "results"
COUNTS = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
ASSETS, DAGS, PER_RUN = 200, 300, 10
LOAD = """
INSERT INTO asset (id, name, uri, "group", extra, created_at, updated_at)
SELECT a, 'asset_' || a, 's3://bench/' || a, 'asset', '{}', timestamptz '2025-01-01', timestamptz '2025-01-01'
FROM generate_series(0, %(assets)s - 1) AS a;
INSERT INTO dag (dag_id, is_paused, is_stale, bundle_name, timetable_type, partition_mapper_info,
                 max_active_tasks, max_consecutive_failed_dag_runs, has_task_concurrency_limits)
SELECT 'dag_' || d, false, false, 'dags-folder', 'AssetTriggeredTimetable', '{}', 16, 0, false
FROM generate_series(0, %(dags)s - 1) AS d;
INSERT INTO dag_schedule_asset_reference (asset_id, dag_id, created_at, updated_at)
SELECT d %% %(assets)s, 'dag_' || d, timestamptz '2025-01-01', timestamptz '2025-01-01'
FROM generate_series(0, %(dags)s - 1) AS d;
-- event i: asset i %% assets, the (i / assets)-th event of its asset, one second apart
INSERT INTO asset_event (id, asset_id, extra, timestamp)
SELECT i, i %% %(assets)s, '{}', timestamptz '2025-01-01' + (i || ' seconds')::interval
FROM generate_series(0, %(n)s - 1) AS i;
-- run r of DAG d consumes events j in [r * per_run, (r + 1) * per_run) of its asset
INSERT INTO dag_run (id, dag_id, run_id, run_type, run_after, state, queued_at, created_at, clear_number,
                     span_status, triggered_by, conf)
SELECT d * %(runs)s + r, 'dag_' || d, 'asset_triggered__' || r, 'asset_triggered', t, 'success',
       t + interval '1 second', t + interval '1 second', 0, 'not_started', 'ASSET', '{}'
FROM generate_series(0, %(dags)s - 1) AS d, generate_series(0, %(runs)s - 1) AS r,
     LATERAL (SELECT timestamptz '2025-01-01'
                     + ((((r + 1) * %(per_run)s - 1) * %(assets)s + d %% %(assets)s) || ' seconds')::interval) AS x(t);
INSERT INTO dagrun_asset_event (dag_run_id, event_id)
SELECT d * %(runs)s + j / %(per_run)s, j * %(assets)s + d %% %(assets)s
FROM generate_series(0, %(dags)s - 1) AS d, generate_series(0, %(runs)s * %(per_run)s - 1) AS j;
"""
# After the history: 20 DAGs waiting normally (queue row + 2 newer events of their asset), and 3
# stranded (2 newer events, their latest run re-dated to after them, no queue row); 20 DAGs that never ran.
TAIL = """
INSERT INTO asset_event (id, asset_id, extra, timestamp)
SELECT %(n)s + k, k / 2, '{}', timestamptz '2025-01-01' + ((%(n)s + k) || ' seconds')::interval
FROM generate_series(0, 45) AS k;
INSERT INTO asset_dag_run_queue (asset_id, target_dag_id, created_at)
SELECT d, 'dag_' || d, timestamptz '2025-01-01' + ((%(n)s + 2 * d) || ' seconds')::interval
FROM generate_series(0, 19) AS d;
UPDATE dag_run SET queued_at = now(), created_at = now()
WHERE id IN (SELECT d * %(runs)s + %(runs)s - 1 FROM generate_series(20, 22) AS d);
-- 3 DAGs with an event committed late ("Committed late" in airflow-internals.md): inside their latest
-- run's window, consumed by no run of the DAG (the link of the window's 5th event removed)
DELETE FROM dagrun_asset_event
WHERE (dag_run_id, event_id) IN (SELECT d * %(runs)s + %(runs)s - 1,
                                        ((%(runs)s - 1) * %(per_run)s + 4) * %(assets)s + d %% %(assets)s
                                 FROM generate_series(30, 32) AS d);
-- 20 DAGs on busy assets that never ran (a full walk of their assets' events if not gated)
INSERT INTO dag (dag_id, is_paused, is_stale, bundle_name, timetable_type, partition_mapper_info,
                 max_active_tasks, max_consecutive_failed_dag_runs, has_task_concurrency_limits)
SELECT 'never_' || d, false, false, 'dags-folder', 'AssetTriggeredTimetable', '{}', 16, 0, false
FROM generate_series(0, 19) AS d;
INSERT INTO dag_schedule_asset_reference (asset_id, dag_id, created_at, updated_at)
SELECT d, 'never_' || d, now(), now() FROM generate_series(0, 19) AS d;
"""
FKS = ("dag_run", "dagrun_asset_event", "dag_schedule_asset_reference", "asset_dag_run_queue", "asset_event", "dag")


def build(size: str) -> str:
    n = COUNTS[size]
    name = f"dupguard_bench_stranded_{size}"
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    params = {"n": n, "assets": ASSETS, "dags": DAGS, "per_run": PER_RUN, "runs": n // ASSETS // PER_RUN}
    with conn.cursor() as cur:
        cur.execute(fixture_sql(SCHEMA))
        cur.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f' "
            "AND conrelid::regclass::text = ANY(%s)",
            (list(FKS),),
        )
        for table, fk in cur.fetchall():
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{fk}"')
        cur.execute(LOAD, params)
        cur.execute(TAIL, params)
        for table in ("asset_event", "dag_run", "dagrun_asset_event", "asset_dag_run_queue", "dag"):
            cur.execute(f"VACUUM ANALYZE {table}")
    conn.close()
    url: str = admin_url().rsplit("/", 1)[0] + "/" + name
    return url


def measure(url: str, repeat: int) -> dict[str, Any]:
    db = open_airflow_db(make_engine(parse_url(url)))
    times, rows = [], []
    with db.engine.connect() as conn:
        sizes = {
            t: conn.exec_driver_sql(f"SELECT pg_total_relation_size('{t}')").scalar_one()
            for t in ("asset_event", "dag_run", "dagrun_asset_event")
        }
        late_times: list[float] = []
        late_rows: list[Any] = []
        for _ in range(repeat):
            start = time.perf_counter()
            rows = statements.stranded_event_candidates(conn, db.tables, None)
            times.append(time.perf_counter() - start)
            conn.rollback()
            start = time.perf_counter()
            late_rows = statements.stranded_late_candidates(conn, db.tables, None)
            late_times.append(time.perf_counter() - start)
            conn.rollback()
    found, late = find_stranded(rows), find_late(late_rows)
    db.engine.dispose()
    return {
        "table_bytes": sizes,
        "check_ms": round(statistics.median(times) * 1000, 2),
        "check_ms_all": [round(t * 1000, 2) for t in times],
        "candidate_rows": len(rows),
        "stranded_sets_found": len(found),
        "stranded_sets_built": 3,
        "late_ms": round(statistics.median(late_times) * 1000, 2),
        "late_ms_all": [round(t * 1000, 2) for t in late_times],
        "late_candidate_rows": len(late_rows),
        "late_sets_found": len(late),
        "late_sets_built": 3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default="stranded_check_cost.json", help="file name under benchmarks/results")
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"provenance": provenance(), "machine": machine(), "repeat": args.repeat, "sizes": {}}
    for size in parse_sizes(args.sizes):
        started = time.monotonic()
        url = build(size)
        built = time.monotonic() - started
        out["sizes"][size] = measure(url, args.repeat) | {"build_seconds": round(built, 1)}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (RESULTS / args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost of the split-partition check (``dupguard run`` every 10 s; ``dupguard scan``) on a large APDR history.

``asset_partition_dag_run`` has only its primary key (docs/explanation/airflow-internals.md, "Asset tables"), so finding
pending rows is a
sequential scan. This measures the queries of ``SplitWatch.check`` — ``partition_rows_with_pending``
then ``partition_row_events`` — and the re-processing lookup ``partition_rows_for_runs`` (one
suspected pair), on a database built from the real Airflow 3.3.2 schema
(tests/fixtures/schema/airflow-3.3.2.sql) with ``--sizes`` APDR rows:

- 300 partitioned DAGs, hourly keys over the history, every row resolved (``created_dag_run_id``
  set) except 20 rows waiting normally, 2 splits (two pending rows of one key) and one old split
  (the history's 5th row pending, a later row of its key resolved);
- 1.5 ``partitioned_asset_key_log`` rows per APDR row on average (with 3.3.2's idx_pakl_apdr_id).

The FK ``created_dag_run_id -> dag_run`` is re-added ``NOT VALID`` after the load (no dag_run rows
are built; the planner does not use FKs for these queries). ``VACUUM ANALYZE`` before timing.

    .venv/bin/python benchmarks/split_check_cost.py --sizes 100k,1m --repeat 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.history import admin_url, connect, machine, parse_sizes  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.checks.split_partition import statements  # noqa: E402
from detector.checks.split_partition.rule import find_split_partitions  # noqa: E402
from detector.metadb import partitions  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from tests.pg import fixture_sql  # noqa: E402

SCHEMA = ROOT / "tests" / "fixtures" / "schema" / "airflow-3.3.2.sql"
RESULTS = ROOT / "benchmarks" / "results"
COUNTS = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}


def build(size: str) -> str:
    n = COUNTS[size]
    name = f"dupguard_bench_split_{size}"
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(fixture_sql(SCHEMA))
        cur.execute("ALTER TABLE asset_partition_dag_run DROP CONSTRAINT apdr_created_dag_run_id_fkey")
        cur.execute(
            """
            INSERT INTO asset_partition_dag_run (id, target_dag_id, created_dag_run_id, partition_key,
                                                 created_at, updated_at)
            SELECT i, 'dag_' || mod(i, 300), CASE WHEN i > %(n)s - 20 THEN NULL ELSE i END,
                   to_char(timestamptz '2025-01-01' + ((i / 300) || ' hours')::interval, 'YYYY-MM-DD"T"HH24'),
                   timestamptz '2025-01-01' + (i || ' seconds')::interval,
                   timestamptz '2025-01-01' + (i || ' seconds')::interval
            FROM generate_series(1, %(n)s) AS i
            """,
            {"n": n},
        )
        # Two splits: the rows of one key, both pending (an AND consumer waiting for ever).
        cur.execute(
            """
            INSERT INTO asset_partition_dag_run (id, target_dag_id, created_dag_run_id, partition_key,
                                                 created_at, updated_at)
            VALUES (%(n)s + 1, 'split_dag', NULL, 'k1', now() - interval '1 hour', now()),
                   (%(n)s + 2, 'split_dag', NULL, 'k1', now() - interval '1 hour', now()),
                   (%(n)s + 3, 'split_dag', NULL, 'k2', now() - interval '1 hour', now()),
                   (%(n)s + 4, 'split_dag', NULL, 'k2', now() - interval '1 hour', now())
            """,
            {"n": n},
        )
        # An old split whose newest row made its run: row 5 left pending, a later row of its key resolved.
        cur.execute("UPDATE asset_partition_dag_run SET created_dag_run_id = NULL WHERE id = 5")
        cur.execute(
            """
            INSERT INTO asset_partition_dag_run (id, target_dag_id, created_dag_run_id, partition_key,
                                                 created_at, updated_at)
            SELECT %(n)s + 5, target_dag_id, %(n)s + 5, partition_key, created_at + interval '1 second', now()
            FROM asset_partition_dag_run WHERE id = 5
            """,
            {"n": n},
        )
        cur.execute(
            """
            INSERT INTO partitioned_asset_key_log (id, asset_id, asset_event_id, asset_partition_dag_run_id,
                source_partition_key, target_dag_id, target_partition_key, created_at)
            SELECT row_number() OVER (), 1 + a.id % 200, a.id * 2 + k, a.id, a.partition_key, a.target_dag_id,
                   a.partition_key, a.created_at
            FROM asset_partition_dag_run a CROSS JOIN generate_series(0, 1) AS k
            WHERE k = 0 OR a.id % 2 = 0
            """
        )
        cur.execute("SELECT setval('asset_partition_dag_run_id_seq', (SELECT max(id) FROM asset_partition_dag_run))")
        cur.execute(
            "ALTER TABLE asset_partition_dag_run ADD CONSTRAINT apdr_created_dag_run_id_fkey "
            "FOREIGN KEY (created_dag_run_id) REFERENCES dag_run(id) ON DELETE CASCADE NOT VALID"
        )
        cur.execute("VACUUM ANALYZE asset_partition_dag_run")
        cur.execute("VACUUM ANALYZE partitioned_asset_key_log")
    conn.close()
    url: str = admin_url().rsplit("/", 1)[0] + "/" + name
    return url


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000, result


def measure(url: str, repeat: int) -> dict[str, Any]:
    db = open_airflow_db(make_engine(parse_url(url)))
    t = db.tables
    with db.engine.connect() as conn:
        apdr_bytes = conn.exec_driver_sql("SELECT pg_total_relation_size('asset_partition_dag_run')").scalar_one()
        ms_rows, rows = timed(lambda: statements.partition_rows_with_pending(conn, t), repeat)
        ids = [r.id for r in rows]
        ms_events, events = timed(lambda: statements.partition_row_events(conn, t, ids), repeat)
        ms_origins, _ = timed(lambda: partitions.partition_rows_for_runs(conn, t, [1000, 1001]), repeat)
    splits = find_split_partitions(rows, events, datetime.now(UTC))
    db.engine.dispose()
    return {
        "apdr_table_bytes": apdr_bytes,
        "pending_rows_ms": round(ms_rows, 2),
        "row_events_ms": round(ms_events, 2),
        "check_ms": round(ms_rows + ms_events, 2),
        "rows_for_two_runs_ms": round(ms_origins, 2),
        "rows_read": len(rows),
        "splits_found": len(splits),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1m")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"provenance": provenance(), "machine": machine(), "repeat": args.repeat, "sizes": {}}
    for size in parse_sizes(args.sizes):
        started = time.monotonic()
        url = build(size)
        built = time.monotonic() - started
        out["sizes"][size] = measure(url, args.repeat) | {"build_seconds": round(built, 1)}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (RESULTS / "split_check_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

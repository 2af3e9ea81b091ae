"""Cost of the trigger_flapping check (``dupguard run`` every 10 s; ``dupguard scan`` once) at 1M and 10M rows.

The check reads the asset and callback triggers with what they feed (``flapping_candidates``), then
the owners' triggerer jobs (``triggerer_jobs_by_id``, live) or every triggerer job
(``triggerer_jobs_since``, scan). Its tables are ``trigger`` and ``job``: on the real Airflow 3.3.2
schema (tests/fixtures/schema/airflow-3.3.2.sql) this builds ``--sizes`` rows in each:

- ``trigger``: 100 AssetWatcher triggers (``asset_watcher`` -> 100 assets, 3 consumer DAGs each), 100
  deadline-callback triggers (``callback`` + ``deadline``; 1,000 more callbacks without a trigger),
  every other row a task-deferral trigger nothing of ours refers to (Airflow deletes those once done,
  so a big table is the worst case, not the usual one);
- ``job``: 1,000 TriggererJob rows (two alive), the rest SchedulerJob/DagProcessorJob rows.

Only the indexes Airflow ships. ``VACUUM ANALYZE`` before timing; medians of ``--repeat``.

    .venv/bin/python benchmarks/trigger_flapping_cost.py --sizes 1m,10m --repeat 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.history import admin_url, connect, machine  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.checks.trigger_flapping import statements  # noqa: E402
from detector.checks.trigger_flapping.rule import UNPROTECTED, exposure, judge_owners  # noqa: E402
from detector.checks.trigger_flapping.statements import trigger_tables  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from tests.pg import fixture_sql  # noqa: E402

SCHEMA = ROOT / "tests" / "fixtures" / "schema" / "airflow-3.3.2.sql"
RESULTS = ROOT / "benchmarks" / "results"
COUNTS = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
LOAD = [
    # dag runs for the deadlines, assets and their consumers
    """INSERT INTO dag_run (id, dag_id, run_id, run_type, run_after, state)
       SELECT i, 'late_' || i, 'manual__' || i, 'manual', now(), 'running' FROM generate_series(1, 1100) AS i""",
    """INSERT INTO asset (id, name, uri, "group", extra, created_at, updated_at)
       SELECT i, 'asset_' || i, 's3://b/' || i, 'asset', '{}', now(), now() FROM generate_series(1, 100) AS i""",
    """INSERT INTO trigger (id, classpath, kwargs, created_date, triggerer_id)
       SELECT i, 'airflow.providers.standard.triggers.temporal.DateTimeTrigger', repeat('x', 120),
              now() - interval '1 day' + (i || ' ms')::interval,
              1 + i %% 2
       FROM generate_series(1, %(n)s) AS i""",
    """INSERT INTO asset_watcher (name, asset_id, trigger_id)
       SELECT 'w' || i, i, i FROM generate_series(1, 100) AS i""",
    """INSERT INTO dag_schedule_asset_reference (asset_id, dag_id, created_at, updated_at)
       SELECT 1 + i %% 100, 'consumer_' || i, now(), now() FROM generate_series(0, 299) AS i""",
    """INSERT INTO callback (id, type, fetch_method, data, state, priority_weight, created_at, trigger_id)
       SELECT md5(i::text)::uuid, 'triggerer', 'import_path', '{}', CASE WHEN i <= 100 THEN 'queued' ELSE 'success' END,
              1, now(), CASE WHEN i <= 100 THEN 100 + i END
       FROM generate_series(1, 1100) AS i""",
    """INSERT INTO deadline (id, created_at, last_updated_at, dagrun_id, deadline_time, missed, callback_id)
       SELECT md5('d' || i)::uuid, now(), now(), i, now(), true, md5(i::text)::uuid
       FROM generate_series(1, 1100) AS i""",
    """INSERT INTO job (id, job_type, state, hostname, start_date, end_date, latest_heartbeat)
       SELECT i, CASE WHEN i %% (%(n)s / 1000) = 0 OR i <= 2 THEN 'TriggererJob'
                      WHEN i %% 2 = 0 THEN 'SchedulerJob' ELSE 'DagProcessorJob' END,
              CASE WHEN i <= 2 THEN 'running' ELSE 'success' END, 'host-' || i,
              now() - ((%(n)s - i) || ' minutes')::interval,
              CASE WHEN i <= 2 THEN NULL ELSE now() - ((%(n)s - i) || ' minutes')::interval + interval '50 s' END,
              CASE WHEN i <= 2 THEN now() ELSE now() - ((%(n)s - i) || ' minutes')::interval + interval '50 s' END
       FROM generate_series(1, %(n)s) AS i""",
]


def build(size: str) -> str:
    n = COUNTS[size]
    name = f"dupguard_bench_triggers_{size}"
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(fixture_sql(SCHEMA))
        cur.execute("SET session_replication_role = replica")  # FKs: rows above are consistent by construction
        for statement in LOAD:
            cur.execute(statement, {"n": n})
        for t in ("trigger", "job", "asset_watcher", "callback", "deadline", "dag_schedule_asset_reference"):
            cur.execute(f"VACUUM ANALYZE {t}")
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
    tt = trigger_tables(db.info.family)
    with db.engine.connect() as conn:
        sizes = {
            t: conn.exec_driver_sql(f"SELECT pg_total_relation_size('{t}')").scalar_one() for t in ("trigger", "job")
        }
        ms_candidates, triggers = timed(lambda: statements.flapping_candidates(conn, tt), repeat)
        owners = {t.triggerer_id for t in triggers if t.triggerer_id is not None}
        ms_owners, owner_jobs = timed(lambda: statements.triggerer_jobs_by_id(conn, tt, owners), repeat)
        ms_all, all_jobs = timed(lambda: statements.triggerer_jobs_since(conn, tt, None), repeat)
        since = datetime.now(UTC) - timedelta(days=30)
        ms_since, _ = timed(lambda: statements.triggerer_jobs_since(conn, tt, since), repeat)
    db.engine.dispose()
    now = datetime.now(UTC)
    _, memory = judge_owners(triggers, owner_jobs, {}, now, timedelta(seconds=30))
    found = exposure(triggers, all_jobs, UNPROTECTED[db.info.family.value])
    return {
        "table_bytes": sizes,
        "candidates_ms": round(ms_candidates, 2),
        "owner_jobs_ms": round(ms_owners, 2),
        "live_check_ms": round(ms_candidates + ms_owners, 2),
        "all_triggerer_jobs_ms": round(ms_all, 2),
        "triggerer_jobs_30d_ms": round(ms_since, 2),
        "scan_check_ms": round(ms_candidates + ms_all, 2),
        "triggers_read": len(triggers),
        "triggerer_jobs_read": len(all_jobs),
        "remembered": len(memory),
        "exposures": len(found),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    out: dict[str, Any] = {"provenance": provenance(), "machine": machine(), "repeat": args.repeat, "sizes": {}}
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        started = time.monotonic()
        url = build(size)
        built = time.monotonic() - started
        out["sizes"][size] = measure(url, args.repeat) | {"build_seconds": round(built, 1)}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (RESULTS / "trigger_flapping_cost.json").write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Synthetic Airflow 3.1.2 histories for the detection-cost benchmarks (docs/explanation/performance.md).

One PostgreSQL database per size (``dupguard_bench_100k`` …), created from the real ``airflow db
migrate`` schema (tests/fixtures/schema/airflow-3.1.2.sql), filled with set-based SQL
(``INSERT … SELECT … FROM generate_series``) and then ``VACUUM ANALYZE``d:

- 300 DAGs, 200 assets, one year of history ending at build time, run ``i`` at
  ``start + (i-1)·step + jitter`` (ids follow creation order, as the sequence does);
- ~85 % ``asset_triggered`` runs consuming 1-3 ``asset_event`` rows each (the last event 2 ms
  before ``run_after``, as the ADRQ row that sets run_after is written with the event); 10 % of
  them also consume an event of the previous run of another DAG (one event fanning out to two
  consumers: a look-alike that must not be flagged); the rest scheduled (10 %), manual (4 %),
  backfill (1 %);
- ``queued_at`` 0.2-10 s after ``run_after`` (5 % of runs: 5-60 min, e.g. AND conditions or
  ``max_active_runs``); two scheduler jobs per week, so ``creating_job_id`` spans ~106 jobs;
- planted duplicates (docs/explanation/airflow-internals.md, "The 3.0/3.1 race"): row ``i`` copies row ``i-1`` (dag_id,
run_after to the
  microsecond, consumed events) with the other scheduler's ``creating_job_id`` and ``queued_at``
  60 ms later: one every 20 000 runs, plus 4 more in the last 20 hours so that ``scan --since 1d``
  has something to find at every size. They are listed in ``bench.planted``;
- task instances (2-3 per run) for the runs of the last ``--ti-days`` days only (default 7):
  a year of TIs would triple build time and disk without changing the index lookups we measure.

Indexes and constraints of the four big tables are dropped before the load and recreated from
their own definitions (``pg_get_indexdef`` / ``pg_get_constraintdef``) afterwards, so the final
schema is exactly Airflow's. Benchmark bookkeeping lives in schema ``bench``, which dupguard never
reads.

    .venv/bin/python benchmarks/history.py --sizes 100k,1m,10m [--rebuild]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg2
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script (benchmarks/ first on the path) or imported as benchmarks.history

from benchmarks.provenance import provenance  # noqa: E402

SCHEMA = ROOT / "tests" / "fixtures" / "schema" / "airflow-3.1.2.sql"
RESULTS = ROOT / "benchmarks" / "results"
BENCH_PORT = "55450"

SIZES = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
DAGS = 300
ASSETS = 200
SPAN = timedelta(days=365)
DUP_EVERY = 20_000
LASTDAY_DUPS = 4
LASTDAY_WINDOW = timedelta(hours=20)
BIG_TABLES = ("dag_run", "asset_event", "dagrun_asset_event", "task_instance")
FORMAT_VERSION = 1  # bump when the generator changes: existing databases are rebuilt


def parse_sizes(text: str) -> list[str]:
    sizes = [s.strip().lower() for s in text.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown size(s) {unknown}; choose from {','.join(SIZES)}")
    return sizes


def admin_url() -> str:
    """The benchmark server's superuser URL: $DUPGUARD_BENCH_DATABASE_URL, else our own cluster.

    The default cluster is scripts/postgres.sh on port 55450 with data in /tmp/dupguard-bench-55450
    (fsync off), separate from the test suite's cluster.
    """
    url = os.environ.get("DUPGUARD_BENCH_DATABASE_URL")
    if url:
        return url
    env = dict(os.environ)
    env.setdefault("DUPGUARD_TEST_PG_PORT", BENCH_PORT)
    env.setdefault("DUPGUARD_TEST_PG_DATA", f"/tmp/dupguard-bench-{env['DUPGUARD_TEST_PG_PORT']}")  # noqa: S108
    out = subprocess.run(
        [str(ROOT / "scripts" / "postgres.sh"), "start"], check=True, capture_output=True, text=True, env=env
    )
    url = out.stdout.strip()
    os.environ["DUPGUARD_BENCH_DATABASE_URL"] = url
    return url


def db_name(size: str) -> str:
    return f"dupguard_bench_{size}"


def db_url(size: str) -> str:
    return make_url(admin_url()).set(database=db_name(size)).render_as_string(hide_password=False)


def connect(dbname: str = "postgres", autocommit: bool = True) -> Any:
    conn = psycopg2.connect(make_url(admin_url()).set(database=dbname).render_as_string(hide_password=False))
    conn.autocommit = autocommit
    return conn


@dataclass(frozen=True)
class Meta:
    size: str
    runs: int
    t_end: datetime
    ti_days: int
    build_seconds: float
    db_bytes: int
    tables: dict[str, int]  # table -> total bytes (heap + indexes + toast)
    rows: dict[str, int]
    planted_pairs: int
    build_steps_seconds: dict[str, float]


def read_meta(size: str) -> Meta | None:
    """The finished history's metadata, or None if the database is missing, incomplete or stale."""
    admin = connect()
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db_name(size),))
            if cur.fetchone() is None:
                return None
    finally:
        admin.close()
    conn = connect(db_name(size))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('bench.meta')")
            if cur.fetchone()[0] is None:
                return None
            cur.execute("SELECT doc FROM bench.meta")
            row = cur.fetchone()
    finally:
        conn.close()
    if row is None or row[0].get("format") != FORMAT_VERSION:
        return None
    doc = row[0]
    return Meta(
        size=doc["size"],
        runs=doc["runs"],
        t_end=datetime.fromisoformat(doc["t_end"]),
        ti_days=doc["ti_days"],
        build_seconds=doc["build_seconds"],
        db_bytes=doc["db_bytes"],
        tables=doc["tables"],
        rows=doc["rows"],
        planted_pairs=doc["planted_pairs"],
        build_steps_seconds=doc.get("build_steps_seconds", {}),
    )


def _schema_sql() -> str:
    # pg_dump >= 15.14 writes psql-only \restrict lines; they carry no SQL.
    return "\n".join(line for line in SCHEMA.read_text().splitlines() if not line.startswith("\\"))


def _lastday_positions(n: int) -> list[int]:
    rows_in_window = n * (LASTDAY_WINDOW / SPAN)
    picked: list[int] = []
    for k in range(1, LASTDAY_DUPS + 1):
        i = n - round(k * rows_in_window / (LASTDAY_DUPS + 1))
        while i % DUP_EVERY in (0, 1, DUP_EVERY - 1) or any(abs(i - p) < 3 for p in picked):
            i -= 1
        picked.append(i)
    return sorted(picked)


def _functions(n: int, t_end: datetime) -> str:
    """Deterministic per-row choices as inlinable SQL functions of the row number."""
    step = SPAN.total_seconds() / n
    start = (t_end - SPAN).isoformat()
    lastday = ",".join(str(i) for i in _lastday_positions(n))
    return f"""
CREATE SCHEMA bench;
CREATE FUNCTION bench.h(x bigint, k bigint) RETURNS bigint IMMUTABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT abs(hashint8extended(x, k)) $$;
CREATE FUNCTION bench.is_dup(i bigint) RETURNS boolean IMMUTABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT i > 1 AND (i % {DUP_EVERY} = 0 OR i = ANY('{{{lastday}}}'::bigint[])) $$;
CREATE FUNCTION bench.base(i bigint) RETURNS bigint IMMUTABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT CASE WHEN bench.is_dup(i) THEN i - 1 ELSE i END $$;
CREATE FUNCTION bench.dag_of(b bigint) RETURNS int IMMUTABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT (bench.h(b, 1) % {DAGS})::int $$;
CREATE FUNCTION bench.type_of(b bigint) RETURNS text IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
  SELECT CASE WHEN bench.is_dup(b + 1) THEN 'asset_triggered'
              WHEN bench.h(b, 2) % 100 < 85 THEN 'asset_triggered'
              WHEN bench.h(b, 2) % 100 < 95 THEN 'scheduled'
              WHEN bench.h(b, 2) % 100 < 99 THEN 'manual'
              ELSE 'backfill' END $$;
CREATE FUNCTION bench.run_after_of(b bigint) RETURNS timestamptz IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
  SELECT timestamptz '{start}'
         + make_interval(secs => (b - 1) * {step!r} + (bench.h(b, 3) % 1000000) / 1e6 * {step * 0.5!r}) $$;
CREATE FUNCTION bench.n_events(b bigint) RETURNS int IMMUTABLE PARALLEL SAFE LANGUAGE sql
  AS $$ SELECT (1 + bench.h(b, 4) % 3)::int $$;
CREATE FUNCTION bench.fans_out(b bigint) RETURNS boolean IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
  SELECT b > 1 AND bench.h(b, 5) % 10 = 0 AND bench.type_of(b - 1) = 'asset_triggered'
         AND NOT bench.is_dup(b - 1) AND bench.dag_of(b - 1) <> bench.dag_of(b) $$;
CREATE FUNCTION bench.job_of(b bigint, other boolean) RETURNS int IMMUTABLE PARALLEL SAFE LANGUAGE sql AS $$
  SELECT (1 + 2 * floor((b - 1) * 53.0 / {n}) + CASE WHEN other THEN 1 - bench.h(b, 6) % 2
                                                     ELSE bench.h(b, 6) % 2 END)::int $$;
"""


def _load_sql(n: int, t_end: datetime, ti_days: int) -> list[tuple[str, str]]:
    """(label, statement) in order; the big tables have no indexes while these run."""
    ti_cutoff = (t_end - timedelta(days=ti_days)).isoformat()
    recent = (t_end - timedelta(hours=2)).isoformat()
    jobs = 2 * 54 + 2
    return [
        (
            "reference rows",
            f"""
INSERT INTO job (id, job_type, state, hostname, unixname, executor_class, start_date, end_date, latest_heartbeat)
SELECT j, 'SchedulerJob', CASE WHEN j > {jobs - 2} THEN 'running' ELSE 'success' END,
       'airflow-scheduler-' || (j % 2), 'airflow', 'CeleryExecutor',
       timestamptz '{(t_end - SPAN).isoformat()}' + (j / 2) * interval '7 days', NULL, now()
FROM generate_series(1, {jobs}) j;
SELECT setval('job_id_seq', {jobs});
INSERT INTO dag_bundle (name, active) VALUES ('dags-folder', true);
INSERT INTO dag (dag_id, is_paused, is_stale, fileloc, relative_fileloc, bundle_name, owners,
                 max_active_tasks, max_active_runs, max_consecutive_failed_dag_runs, has_task_concurrency_limits,
                 timetable_summary)
SELECT 'dag_' || lpad(d::text, 3, '0'), false, false, '/opt/airflow/dags/dag_' || d || '.py',
       'dag_' || d || '.py', 'dags-folder', 'data', 16, 16, 0, false, 'Asset'
FROM generate_series(0, {DAGS - 1}) d;
INSERT INTO dag_version (id, version_number, dag_id, bundle_name, created_at, last_updated)
SELECT md5('dv' || d)::uuid, 1, 'dag_' || lpad(d::text, 3, '0'), 'dags-folder', now(), now()
FROM generate_series(0, {DAGS - 1}) d;
INSERT INTO asset (id, name, uri, "group", extra, created_at, updated_at)
SELECT a, 'asset_' || a, 's3://lake/table_' || a, 'asset', '{{}}', now(), now() FROM generate_series(1, {ASSETS}) a;
SELECT setval('asset_id_seq', {ASSETS});
""",
        ),
        (
            "dag_run",
            f"""
INSERT INTO dag_run (id, dag_id, queued_at, logical_date, start_date, end_date, state, run_id, creating_job_id,
                     run_type, triggered_by, triggering_user_name, conf, data_interval_start, data_interval_end,
                     run_after, last_scheduling_decision, updated_at, clear_number, span_status,
                     created_dag_version_id)
SELECT i, dag_id, queued_at,
       CASE WHEN run_type = 'asset_triggered' THEN NULL ELSE run_after - interval '1 hour' END,
       CASE WHEN state = 'queued' THEN NULL ELSE queued_at + interval '0.5 s' END,
       CASE WHEN state IN ('success', 'failed') THEN queued_at + make_interval(secs => 30 + bench.h(b, 7) % 870) END,
       state,
       run_type || '__' || to_char(CASE WHEN run_type = 'scheduled' THEN run_after - interval '1 hour'
                                        ELSE run_after END AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
         || '+00:00' || CASE WHEN run_type = 'scheduled' THEN '' ELSE '_' || substr(md5(i::text), 1, 8) END,
       CASE WHEN run_type IN ('asset_triggered', 'scheduled') THEN bench.job_of(b, i <> b) END,
       run_type,
       CASE run_type WHEN 'asset_triggered' THEN 'ASSET' WHEN 'scheduled' THEN 'TIMETABLE'
                     WHEN 'manual' THEN 'REST_API' ELSE 'BACKFILL' END,
       CASE WHEN run_type IN ('manual', 'backfill') THEN 'admin' END,
       '{{}}'::jsonb,
       CASE WHEN run_type <> 'asset_triggered' THEN run_after - interval '1 hour' END,
       CASE WHEN run_type <> 'asset_triggered' THEN run_after END,
       run_after,
       queued_at + interval '1 s', queued_at + interval '1 s', 0, 'not_started',
       md5('dv' || bench.dag_of(b))::uuid
FROM (
  SELECT i, b, 'dag_' || lpad(bench.dag_of(b)::text, 3, '0') AS dag_id, bench.type_of(b) AS run_type,
         bench.run_after_of(b) AS run_after,
         bench.run_after_of(b)
           + CASE WHEN bench.h(b, 8) % 100 < 95 THEN make_interval(secs => 0.2 + (bench.h(b, 9) % 9800) / 1000.0)
                  ELSE make_interval(secs => 300 + bench.h(b, 9) % 3300) END
           + CASE WHEN i <> b THEN interval '60 ms' ELSE interval '0' END AS queued_at,
         CASE WHEN bench.run_after_of(b) < timestamptz '{recent}'
                THEN CASE WHEN bench.h(b, 10) % 100 < 97 THEN 'success' ELSE 'failed' END
              WHEN bench.h(b, 10) % 3 = 0 THEN 'queued'
              WHEN bench.h(b, 10) % 3 = 1 THEN 'running' ELSE 'success' END AS state
  FROM (SELECT i, bench.base(i) AS b FROM generate_series(1, {n}) i OFFSET 0) s
  OFFSET 0
) r;
SELECT setval('dag_run_id_seq', {n});
""",
        ),
        (
            "asset_event",
            f"""
INSERT INTO asset_event (id, asset_id, extra, source_task_id, source_dag_id, source_run_id, source_map_index,
                         timestamp)
SELECT (b - 1) * 3 + j, 1 + (bench.dag_of(b) * 3 + j) % {ASSETS}, '{{}}', 'publish',
       'producer_' || lpad(((bench.dag_of(b) * 3 + j) % {ASSETS})::text, 3, '0'),
       'scheduled__' || b || '_' || j, -1,
       bench.run_after_of(b) - make_interval(secs => (bench.n_events(b) - j) * 37 + 0.002)
FROM generate_series(1, {n}) b, generate_series(1, bench.n_events(b)) j
WHERE NOT bench.is_dup(b) AND bench.type_of(b) = 'asset_triggered';
SELECT setval('asset_event_id_seq', {3 * n});
""",
        ),
        (
            "dagrun_asset_event",
            f"""
INSERT INTO dagrun_asset_event (dag_run_id, event_id)
SELECT i, (b - 1) * 3 + j
FROM (SELECT i, bench.base(i) AS b FROM generate_series(1, {n}) i OFFSET 0) s, generate_series(1, bench.n_events(b)) j
WHERE bench.type_of(b) = 'asset_triggered'
UNION ALL
SELECT i, (b - 2) * 3 + 1
FROM (SELECT i, bench.base(i) AS b FROM generate_series(1, {n}) i OFFSET 0) s
WHERE bench.type_of(b) = 'asset_triggered' AND bench.fans_out(b);
""",
        ),
        (
            "task_instance",
            f"""
INSERT INTO task_instance (id, task_id, dag_id, run_id, map_index, start_date, end_date, duration, state,
                           try_number, max_tries, hostname, unixname, pool, pool_slots, queue, priority_weight,
                           operator, queued_dttm, scheduled_dttm, queued_by_job_id, executor, updated_at,
                           span_status, dag_version_id)
SELECT md5(dr.id || '-' || t)::uuid,
       (ARRAY['extract', 'transform', 'load'])[CASE WHEN k = 2 AND t = 2 THEN 3 ELSE t END],
       dr.dag_id, dr.run_id, -1,
       CASE WHEN st IN ('success', 'failed', 'running') THEN dr.start_date + (t - 1) * interval '20 s' END,
       CASE WHEN st IN ('success', 'failed') THEN dr.start_date + (t - 1) * interval '20 s' + interval '15 s' END,
       CASE WHEN st IN ('success', 'failed') THEN 15.0 END,
       st, CASE WHEN st IS NULL THEN 0 ELSE 1 END, 0, 'worker-' || (dr.id % 4), 'airflow',
       'default_pool', 1, 'default', 1, 'PythonOperator',
       dr.start_date, dr.start_date, dr.creating_job_id, 'CeleryExecutor', dr.updated_at,
       'not_started', dr.created_dag_version_id
FROM dag_run dr,
     LATERAL (SELECT (2 + bench.h(dr.id, 11) % 2)::int AS k) kk,
     LATERAL generate_series(1, kk.k) t,
     LATERAL (SELECT CASE
        WHEN dr.state = 'success' THEN 'success'
        WHEN dr.state = 'failed' THEN (ARRAY['success', 'failed', 'upstream_failed'])[t]
        WHEN dr.state = 'running' THEN (ARRAY['success', 'running', NULL])[t]
        ELSE NULL END AS st) s
WHERE dr.run_after >= timestamptz '{ti_cutoff}';
""",
        ),
        (
            "planted",
            """
CREATE TABLE bench.planted AS
SELECT d.id AS duplicate_id, d.id - 1 AS kept_id, d.dag_id, d.run_after
FROM dag_run d WHERE bench.is_dup(d.id);
""",
        ),
    ]


def _ddl_of_big_tables(cur: Any) -> tuple[list[str], list[str], list[str], list[str]]:
    """(drops, index creates, key constraint adds, foreign key adds) for the big tables."""
    names = list(BIG_TABLES)
    cur.execute(
        """
        SELECT c.conname, c.conrelid::regclass::text, pg_get_constraintdef(c.oid)
        FROM pg_constraint c
        WHERE c.contype = 'f' AND (c.conrelid::regclass::text = ANY(%s) OR c.confrelid::regclass::text = ANY(%s))
        ORDER BY 1
        """,
        (names, names),
    )
    fks = cur.fetchall()
    cur.execute(
        """
        SELECT c.conname, c.conrelid::regclass::text, pg_get_constraintdef(c.oid)
        FROM pg_constraint c WHERE c.contype IN ('p', 'u') AND c.conrelid::regclass::text = ANY(%s) ORDER BY 1
        """,
        (names,),
    )
    keys = cur.fetchall()
    cur.execute(
        """
        SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid)
        FROM pg_index i
        WHERE i.indrelid::regclass::text = ANY(%s)
          AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.contype IN ('p', 'u'))
        ORDER BY 1
        """,
        (names,),
    )
    indexes = cur.fetchall()
    drops = [f'ALTER TABLE {t} DROP CONSTRAINT "{n}"' for n, t, _ in fks]
    drops += [f'ALTER TABLE {t} DROP CONSTRAINT "{n}"' for n, t, _ in keys]
    drops += [f'DROP INDEX "{n}"' for n, _ in indexes]
    creates = [d for _, d in indexes]
    key_adds = [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for n, t, d in keys]
    fk_adds = [f'ALTER TABLE {t} ADD CONSTRAINT "{n}" {d}' for n, t, d in fks]
    return drops, creates, key_adds, fk_adds


def build(size: str, ti_days: int = 7, log: Any = print) -> Meta:
    """(Re)create the ``size`` history from scratch and return its metadata."""
    n = SIZES[size]
    name = db_name(size)
    t_end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    started = time.perf_counter()
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    with conn.cursor() as cur:
        cur.execute(_schema_sql())
    conn.close()  # the dump empties search_path for its session
    conn = connect(name)
    steps: dict[str, float] = {}
    with conn.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '1GB'; SET work_mem = '256MB'; SET jit = off")
        cur.execute(_functions(n, t_end))
        drops, creates, key_adds, fk_adds = _ddl_of_big_tables(cur)
        for stmt in drops:
            cur.execute(stmt)
        for label, sql in _load_sql(n, t_end, ti_days):
            t0 = time.perf_counter()
            cur.execute(sql)
            steps[label] = round(time.perf_counter() - t0, 1)
            log(f"  [{size}] {label}: {steps[label]} s")
        t0 = time.perf_counter()
        for stmt in creates + key_adds + fk_adds:
            cur.execute(stmt)
        steps["indexes and constraints"] = round(time.perf_counter() - t0, 1)
        log(f"  [{size}] indexes and constraints: {steps['indexes and constraints']} s")
        t0 = time.perf_counter()
        cur.execute("VACUUM ANALYZE")
        steps["vacuum analyze"] = round(time.perf_counter() - t0, 1)
        log(f"  [{size}] vacuum analyze: {steps['vacuum analyze']} s")
        build_seconds = round(time.perf_counter() - started, 1)
        cur.execute("SELECT pg_database_size(current_database())")
        db_bytes = int(cur.fetchone()[0])
        tables: dict[str, int] = {}
        rows: dict[str, int] = {}
        for table in (*BIG_TABLES, "job"):
            cur.execute("SELECT pg_total_relation_size(%s), (SELECT count(*) FROM " + table + ")", (table,))
            total, count = cur.fetchone()
            tables[table], rows[table] = int(total), int(count)
        cur.execute("SELECT count(*) FROM dag_run WHERE run_type = 'asset_triggered'")
        rows["dag_run asset_triggered"] = int(cur.fetchone()[0])
        cur.execute("SELECT count(*) FROM bench.planted")
        planted = int(cur.fetchone()[0])
        doc = {
            "format": FORMAT_VERSION,
            "size": size,
            "runs": n,
            "t_end": t_end.isoformat(),
            "ti_days": ti_days,
            "build_seconds": build_seconds,
            "build_steps_seconds": steps,
            "db_bytes": db_bytes,
            "tables": tables,
            "rows": rows,
            "planted_pairs": planted,
        }
        cur.execute("CREATE TABLE bench.meta (doc jsonb NOT NULL)")
        cur.execute("INSERT INTO bench.meta VALUES (%s)", (json.dumps(doc),))
    conn.close()
    meta = read_meta(size)
    assert meta is not None
    return meta


def ensure(size: str, *, rebuild: bool = False, ti_days: int = 7, log: Any = print) -> Meta:
    """The ``size`` history, built if missing (or if ``rebuild``)."""
    meta = None if rebuild else read_meta(size)
    if meta is None:
        log(f"building {size} history ({SIZES[size]:,} dag_run rows) in database {db_name(size)}")
        meta = build(size, ti_days=ti_days, log=log)
    return meta


def human_bytes(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n = n / 1024  # type: ignore[assignment]
    return f"{n} B"


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine() -> dict[str, Any]:
    conn = connect()
    with conn.cursor() as cur:
        cur.execute("SELECT version()")
        version = cur.fetchone()[0]
        settings = {}
        for name in (
            "shared_buffers",
            "work_mem",
            "fsync",
            "synchronous_commit",
            "effective_cache_size",
            "random_page_cost",
            "max_parallel_workers_per_gather",
        ):
            cur.execute(f"SHOW {name}")
            settings[name] = cur.fetchone()[0]
    conn.close()
    mem = ""
    with contextlib.suppress(OSError, StopIteration):
        mem = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
    return {"cpus": os.cpu_count(), "memory": mem.split(":", 1)[-1].strip(), "postgres": version, "settings": settings}


def save(name: str, sizes: dict[str, Any], render: Callable[[dict[str, Any]], str], tag: str = "") -> str:
    """Merge this run's per-size results into benchmarks/results/<name>[-<tag>].json and rewrite its .md.

    Merging lets a quick ``--sizes 100k`` run refresh one row without erasing the others; each size
    keeps the commit it was measured on (``provenance``), so merged rows of older code show as such.
    A ``tag`` starts a file of its own instead.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = f"{name}-{tag}" if tag else name
    for measured in sizes.values():
        measured["provenance"] = provenance()
    path = RESULTS / f"{name}.json"
    doc: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    merged = dict(doc.get("sizes", {}))
    merged.update(sizes)
    ordered = {s: merged[s] for s in SIZES if s in merged}
    doc = {"machine": machine(), "updated": datetime.now(UTC).isoformat(timespec="seconds"), "sizes": ordered}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    table = render(ordered)
    (RESULTS / f"{name}.md").write_text(table + "\n")
    return table


def render_history(sizes: dict[str, Any]) -> str:
    rows = []
    for size, m in sizes.items():
        r = m["rows"]
        rows.append(
            [
                size,
                f"{r['dag_run']:,}",
                f"{r['dag_run asset_triggered']:,}",
                f"{r['asset_event']:,}",
                f"{r['dagrun_asset_event']:,}",
                f"{r['task_instance']:,} (last {m['ti_days']} d)",
                m["planted_pairs"],
                f"{m['build_seconds']:.0f} s",
                human_bytes(m["db_bytes"]),
            ]
        )
    headers = [
        "size",
        "dag_run",
        "asset_triggered",
        "asset_event",
        "dagrun_asset_event",
        "task_instance",
        "planted pairs",
        "build time",
        "DB size",
    ]
    return markdown_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1m,10m", help="comma-separated: 100k,1m,10m")
    parser.add_argument("--rebuild", action="store_true", help="drop and rebuild even if the history exists")
    parser.add_argument("--ti-days", type=int, default=7, help="days of recent runs that get task instances")
    args = parser.parse_args(argv)
    metas = {}
    for size in parse_sizes(args.sizes):
        metas[size] = ensure(size, rebuild=args.rebuild, ti_days=args.ti_days).__dict__
    print(save("history", metas, render_history))
    return 0


if __name__ == "__main__":
    sys.exit(main())

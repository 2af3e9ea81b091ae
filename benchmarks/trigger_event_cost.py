"""Cost of the trigger_event kind's reads (docs/explanation/checks.md) at ``--sizes`` rows of ``asset_event``.

The history of benchmarks/stranded_check_cost.py (200 assets, 300 consumer DAGs, every event consumed
by the 1.5 DAGs on its asset, 10 events per run; the 3.3.2 schema with only Airflow's indexes), except
that the events of 20 assets (10 %) are a trigger's (``{"from_trigger": true, "payload":
{"status": "success", "message_batch": [<SQS message>]}}``, no source task) and the others a task's
(``source_dag_id`` set). Then 3 planted duplicates: one message submitted twice (0.2 s apart) on 3
trigger assets, each copy consumed by its own new run of the asset's DAG.

Measured: the poll's extra reads for one new asset run (``copies.near_runs``: its events by primary
key, its trigger events' neighbourhood on ``idx_asset_id_timestamp``, the consumers of copies on
``idx_dagrun_asset_events_event_id``), and scan's (``copies.since``: every trigger event of the
look-back, all history and the last day, parsed in Python).

    .venv/bin/python benchmarks/trigger_event_cost.py --sizes 1m,10m --repeat 5 --out trigger_event_cost.json
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

from benchmarks import stranded_check_cost as base  # noqa: E402
from benchmarks.history import admin_url, connect, machine, parse_sizes  # noqa: E402
from benchmarks.provenance import provenance  # noqa: E402
from detector.core.trigger_event import find_trigger_event_duplicates  # noqa: E402
from detector.metadb import consumption, dag_runs  # noqa: E402
from detector.metadb.engine import make_engine, open_airflow_db, parse_url  # noqa: E402
from detector.sources.database import copies  # noqa: E402
from tests.pg import fixture_sql  # noqa: E402

TRIGGER_ASSETS = 20
SQS = (
    "json_build_object('from_trigger', true, 'payload', json_build_object('status', 'success', 'message_batch', "
    "json_build_array(json_build_object('MessageId', {mid}, 'ReceiptHandle', 'r', 'MD5OfBody', 'x', "
    "'Body', '{{\"order\": 42}}'))))"
)
PLAIN_EVENTS = """INSERT INTO asset_event (id, asset_id, extra, timestamp)
SELECT i, i %% %(assets)s, '{}', timestamptz '2025-01-01' + (i || ' seconds')::interval
FROM generate_series(0, %(n)s - 1) AS i;"""
EVENTS = f"""INSERT INTO asset_event (id, asset_id, extra, source_dag_id, timestamp)
SELECT i, i %% %(assets)s,
       CASE WHEN i %% %(assets)s < {TRIGGER_ASSETS} THEN {SQS.format(mid="'m-' || i")} ELSE '{{}}'::json END,
       CASE WHEN i %% %(assets)s < {TRIGGER_ASSETS} THEN NULL ELSE 'producer' END,
       timestamptz '2025-01-01' + (i || ' seconds')::interval
FROM generate_series(0, %(n)s - 1) AS i;"""
# Asset k (0-2): message dup-k twice, 0.2 s apart, after the history; each copy consumed by its own run of dag_k.
PLANT = f"""
INSERT INTO asset_event (id, asset_id, extra, timestamp)
SELECT %(n)s + 2 * k + c, k, {SQS.format(mid="'dup-' || k")},
       timestamptz '2025-01-01' + ((%(n)s + k * 10) || ' seconds')::interval + c * interval '200 milliseconds'
FROM generate_series(0, 2) AS k, generate_series(0, 1) AS c;
INSERT INTO dag_run (id, dag_id, run_id, run_type, run_after, state, queued_at, created_at, clear_number,
                     span_status, triggered_by, conf)
SELECT 100000000 + 2 * k + c, 'dag_' || k, 'asset_triggered__dup_' || c, 'asset_triggered', t, 'queued', t, t, 0,
       'not_started', 'ASSET', '{{}}'
FROM generate_series(0, 2) AS k, generate_series(0, 1) AS c,
     LATERAL (SELECT timestamptz '2025-01-01' + ((%(n)s + k * 10 + c) || ' seconds')::interval) AS x(t);
INSERT INTO dagrun_asset_event (dag_run_id, event_id)
SELECT 100000000 + 2 * k + c, %(n)s + 2 * k + c FROM generate_series(0, 2) AS k, generate_series(0, 1) AS c;
"""


def build(size: str, events: str = EVENTS, plant: str = PLANT, kind: str = "trigger_event") -> str:
    """The database at ``size`` asset events: the trigger assets' events from ``events``, then ``plant``."""
    n = base.COUNTS[size]
    name = f"dupguard_bench_{kind}_{size}"
    admin = connect()
    with admin.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        cur.execute(f'CREATE DATABASE "{name}"')
    admin.close()
    conn = connect(name)
    params = {"n": n, "assets": base.ASSETS, "dags": base.DAGS, "per_run": base.PER_RUN}
    params["runs"] = n // base.ASSETS // base.PER_RUN
    assert PLAIN_EVENTS in base.LOAD, "stranded_check_cost.LOAD changed: update this benchmark"
    with conn.cursor() as cur:
        cur.execute(fixture_sql(base.SCHEMA))
        cur.execute(
            "SELECT conrelid::regclass::text, conname FROM pg_constraint WHERE contype = 'f' "
            "AND conrelid::regclass::text = ANY(%s)",
            (list(base.FKS),),
        )
        for table, fk in cur.fetchall():
            cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{fk}"')
        cur.execute(base.LOAD.replace(PLAIN_EVENTS, events), params)
        cur.execute(plant, params)
        for table in ("asset_event", "dag_run", "dagrun_asset_event"):
            cur.execute(f"VACUUM ANALYZE {table}")
    conn.close()
    url: str = admin_url().rsplit("/", 1)[0] + "/" + name
    return url


def _median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1000, 2)


def measure(url: str, repeat: int, window: timedelta) -> dict[str, Any]:
    db = open_airflow_db(make_engine(parse_url(url)))
    t = db.tables
    poll, scan_all, scan_day = [], [], []
    with db.engine.connect() as conn:
        sizes = {
            name: conn.exec_driver_sql(f"SELECT pg_total_relation_size('{name}')").scalar_one()
            for name in ("asset_event", "dag_run", "dagrun_asset_event")
        }
        newest = conn.exec_driver_sql("SELECT max(timestamp) FROM asset_event").scalar_one()
        runs = dag_runs.new_runs(conn, t, 100_000_000 - 1, [], 100)
        latest = max(runs, key=lambda r: r.id)  # dag_2's second copy: the poll's newest run
        events = consumption.consumed_events(conn, t, [latest.id])
        for _ in range(repeat):
            start = time.perf_counter()
            found, consumers = copies.near_runs(conn, t, [latest], events, window)
            poll.append(time.perf_counter() - start)
            conn.rollback()
        for out, since in ((scan_all, None), (scan_day, newest - timedelta(days=1))):
            for _ in range(repeat):
                start = time.perf_counter()
                all_found, all_consumers = copies.since(conn, t, since, window)
                out.append(time.perf_counter() - start)
                conn.rollback()
        all_events = consumption.consumed_events(conn, t, [r.id for r in all_consumers])
        trigger_events = conn.exec_driver_sql(
            "SELECT count(*) FROM asset_event WHERE source_dag_id IS NULL"
        ).scalar_one()
    groups = find_trigger_event_duplicates(all_consumers, all_events, all_found)
    db.engine.dispose()
    return {
        "table_bytes": sizes,
        "trigger_events": trigger_events,
        "poll_one_new_run_ms": _median_ms(poll),
        "poll_ms_all": [round(x * 1000, 2) for x in poll],
        "poll_copies_found": len(found),
        "poll_consumers": len(consumers),
        "scan_all_history_ms": _median_ms(scan_all),
        "scan_last_day_ms": _median_ms(scan_day),
        "groups_found": len(groups),
        "groups_planted": 3,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1m,10m")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="trigger_event_cost.json", help="file name under benchmarks/results")
    args = parser.parse_args(argv)
    window = timedelta(seconds=60)  # DUPGUARD_SUSPECT_WINDOW's default
    out: dict[str, Any] = {
        "provenance": provenance(),
        "machine": machine(),
        "repeat": args.repeat,
        "window_seconds": 60,
        "sizes": {},
    }
    for size in parse_sizes(args.sizes):
        started = time.monotonic()
        url = build(size)
        built = time.monotonic() - started
        out["sizes"][size] = measure(url, args.repeat, window) | {"build_seconds": round(built, 1)}
        print(size, json.dumps(out["sizes"][size]), flush=True)
    (base.RESULTS / args.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The sibling statement's plan on a big dag_run: which indexes answer a storm's batch and a lone run.

A 3.1.2 schema (``airflow db migrate``'s template) gets a synthetic history of ``--runs`` asset runs
over 500 DAGs, one event each (generate_series: benchmark data, not a test fixture), then a storm of
``--storm`` duplicate pairs committed at once (tests.writer, as benchmarks/storm.py). After VACUUM
ANALYZE, ``siblings._siblings_statement`` is run under EXPLAIN ANALYZE for one asking run and for the
storm's batch. The database is dropped at the end.

    .venv/bin/python -m benchmarks.sibling_explain --runs 500000 --storm 500

Writes benchmarks/results/sibling_explain.txt, its provenance first.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from benchmarks.provenance import provenance
from detector.core.model import Run
from detector.metadb import consumption, dag_runs, siblings
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from tests.pg import Templates
from tests.writer import AirflowWriter

RESULTS = Path(__file__).resolve().parent / "results"
LOAD = """
INSERT INTO asset (id, name, uri, "group", extra, created_at, updated_at)
  VALUES (1, 'a', 'a', 'asset', '{{}}', now(), now()) ON CONFLICT DO NOTHING;
INSERT INTO asset_event (id, asset_id, extra, timestamp)
  SELECT g, 1, '{{}}', now() - (g || ' seconds')::interval FROM generate_series(1, {n}) g;
INSERT INTO dag_run (id, dag_id, run_id, run_type, run_after, state, queued_at, triggered_by, conf, clear_number,
                     span_status, updated_at)
  SELECT g, 'dag_' || (g % 500), 'asset_triggered__' || g, 'asset_triggered', now() - (g || ' seconds')::interval,
         'success', now(), 'ASSET', '{{}}', 0, 'not_started', now()
  FROM generate_series(1, {n}) g;
INSERT INTO dagrun_asset_event (dag_run_id, event_id) SELECT g, g FROM generate_series(1, {n}) g;
SELECT setval(pg_get_serial_sequence('dag_run', 'id'), {n});
SELECT setval(pg_get_serial_sequence('asset_event', 'id'), {n});
"""


def run(runs: int, storm: int) -> list[str]:
    templates = Templates(made={})
    url = templates.clone("3.1.2")
    out: list[str] = []
    try:
        raw = AirflowWriter(url)
        with raw.conn, raw.conn.cursor() as cur:
            cur.execute(LOAD.format(n=runs))
        raw.conn.autocommit = True
        with raw.conn.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
        raw.conn.autocommit = False
        raw.storm(storm)
        raw.close()
        engine = make_engine(parse_url(url))
        t = open_airflow_db(engine).tables
        with engine.connect() as conn:
            for asking in (1, storm):
                new = dag_runs.new_runs(conn, t, runs, [], 2 * storm)[: 2 * asking]
                events = consumption.consumed_events(conn, t, [r.id for r in new])
                askers: dict[tuple[Any, ...], Run] = {}
                for r in new:
                    askers.setdefault((r.dag_id, r.run_after, tuple(sorted(events.get(r.id, ())))), r)
                stmt, params = siblings._siblings_statement(
                    t, list(askers.values()), events, timedelta(minutes=5), "postgresql"
                )
                compiled = stmt.params(params).compile(
                    dialect=engine.dialect, compile_kwargs={"render_postcompile": True}
                )
                sql = conn.connection.cursor().mogrify(str(compiled), compiled.params).decode()
                started = time.perf_counter()
                plan = conn.exec_driver_sql("EXPLAIN (ANALYZE, COSTS OFF) " + sql.replace("%", "%%")).scalars().all()
                out += [
                    f"--- {len(askers)} asking run(s) ({time.perf_counter() - started:.3f} s with EXPLAIN)",
                    *plan,
                    "",
                ]
        engine.dispose()
    finally:
        templates.drop_all()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=500_000)
    parser.add_argument("--storm", type=int, default=500)
    args = parser.parse_args(argv)
    lines = run(args.runs, args.storm)
    head = json.dumps({"provenance": provenance(), "runs": args.runs, "storm": args.storm}, indent=2)
    (RESULTS / "sibling_explain.txt").write_text(head + "\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

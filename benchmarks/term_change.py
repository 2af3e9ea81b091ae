"""What a leader term change costs: ``--runs`` asset runs inside the look-back, a daemon
(in-memory ledger, the README's read-only role) judges them, its role is cut off (connection limit 0,
sessions ended), ``--gap`` runs are committed, the role reconnects. Reported: seconds from reconnecting
to the gap judged, and the dag_run rows the new term's fetches read. An earlier dupguard's new term
re-read the whole look-back; run it from an older checkout with ``PYTHONPATH=<checkout>`` to compare.

    DUPGUARD_TEST_DATABASE_URL=... .venv/bin/python -m benchmarks.term_change [--runs 6500] [--gap 10]
"""

from __future__ import annotations

import argparse
import json
import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url

from benchmarks.provenance import provenance
from detector.sources.database.source import DatabaseSource
from tests.daemon_harness import start_daemon, wait_for
from tests.integration.test_grants import documented_grants
from tests.pg import ROOT, Templates, execute_admin
from tests.writer import AirflowWriter


def _history(db: str, runs: int) -> None:
    """``runs`` asset runs, one event each, queued now (set-based: seconds for thousands)."""
    execute_admin(
        f"INSERT INTO asset_event (asset_id, extra, source_dag_id, timestamp) SELECT 1, '{{}}', 'producer', "
        f"now() - (g || ' ms')::interval FROM generate_series(1, {runs}) g; "
        "INSERT INTO dag_run (dag_id, run_id, run_type, run_after, state, queued_at, creating_job_id, triggered_by, "
        "conf, clear_number, span_status) SELECT 'dag_' || (g % 50), 'asset_triggered__' || g, 'asset_triggered', "
        f"now() - (({runs} - g) || ' ms')::interval, 'queued', now(), 1, 'ASSET', '{{}}', 0, 'not_started' "
        f"FROM generate_series(1, {runs}) g; "
        f"INSERT INTO dagrun_asset_event (dag_run_id, event_id) SELECT g, g FROM generate_series(1, {runs}) g",
        dbname=db,
    )


def measure(templates: Templates, runs: int, gap: int) -> dict[str, Any]:
    url = templates.clone("3.1.2")
    db = str(make_url(url).database)
    role = f"dg_bench_{uuid.uuid4().hex[:6]}"
    execute_admin(f'CREATE ROLE "{role}" LOGIN')
    grant = documented_grants(ROOT / "README.md")["3.0 and 3.1"]
    execute_admin(grant.replace("TO dupguard;", f'TO "{role}";'), dbname=db)
    writer = AirflowWriter(url)  # before the history: it inserts the asset and the scheduler jobs
    _history(db, runs)
    d = start_daemon(make_url(url).set(username=role).render_as_string(hide_password=False), durable=False,
                     startup_lookback=timedelta(minutes=15))  # fmt: skip
    try:
        wait_for(d.is_leader, what="leadership")
        source = d.daemon.parts.source
        rows: list[int] = []

        def count(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
            if "WHERE dag_run.id >" in statement:
                rows.append(int(cursor.rowcount))

        assert isinstance(source, DatabaseSource)
        event.listen(source.db.engine, "after_cursor_execute", count)

        def high() -> int:
            value = source.summary()["watermark"]
            return value if isinstance(value, int) else 0

        wait_for(lambda: high() >= runs, timeout=600, what="the history")
        polls = d.metrics.registry.get_sample_value("dupguard_poll_duration_seconds_count") or 0.0
        passes = "dupguard_poll_duration_seconds_count"
        wait_for(lambda: (d.metrics.registry.get_sample_value(passes) or 0.0) >= polls + 2, timeout=600,
                 what="the pass that read the history to finish")  # fmt: skip
        execute_admin(f'ALTER ROLE "{role}" CONNECTION LIMIT 0')
        execute_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        wait_for(lambda: not d.is_leader() and not source.watching, what="the term to end")
        newest = [writer.ordinary(f"gap_{i}") for i in range(gap)][-1].id
        rows.clear()
        execute_admin(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
        took = wait_for(lambda: source.watching and high() == newest, timeout=600, what="the gap")
        return {"runs_in_lookback": runs, "gap_runs": gap, "seconds_to_gap_judged": round(took, 3),
                "rows_fetched": sum(rows)}  # fmt: skip
    finally:
        d.stop()
        writer.close()
        execute_admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        execute_admin(f'DROP OWNED BY "{role}"', dbname=db)
        execute_admin(f'DROP ROLE "{role}"')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6500)
    parser.add_argument("--gap", type=int, default=10)
    args = parser.parse_args()
    templates = Templates(made={})
    try:
        print(json.dumps({"provenance": provenance(), **measure(templates, args.runs, args.gap)}))
    finally:
        templates.drop_all()


if __name__ == "__main__":
    main()

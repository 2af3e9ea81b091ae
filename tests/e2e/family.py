"""What Airflow recorded of the rest of the HA family (issue 25) in one end-to-end run, and what dupguard's
periodic checks said of it: the truth never comes from dupguard's rules.

- **A trigger run by two triggerers** (§1): each triggerer logs ``trigger <name> starting`` for every
  trigger it runs (``TriggerRunner.run_trigger``, airflow/jobs/triggerer_job_runner.py L1110 in 3.1.2);
  a trigger in the logs of two triggerers ran twice. The consequence is in ``asset_event``: the
  watcher's events (``extra.from_trigger``) against the files the harness wrote (one event each when
  one triggerer runs the trigger).
- **Asset events that trigger nothing** (§2): an event of an asset a DAG is scheduled on that no run of
  that DAG consumed (``dagrun_asset_event``), although a run of that DAG was queued after it, with no
  queue row left for it (``asset_dag_run_queue``), read after the drain.
- dupguard: its ``<kind>_detected`` log lines (one per observation; the ledger claims each once).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.e2e.harness import read_json_log

STARTING = re.compile(r"trigger (?P<name>.+?) starting")
STRANDED = """
SELECT r.dag_id, e.id AS event_id
FROM asset_event e
JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id
WHERE NOT EXISTS (
        SELECT 1 FROM dagrun_asset_event c JOIN dag_run dr ON dr.id = c.dag_run_id
        WHERE c.event_id = e.id AND dr.dag_id = r.dag_id)
  AND EXISTS (SELECT 1 FROM dag_run dr WHERE dr.dag_id = r.dag_id AND dr.queued_at > e.timestamp)
  AND NOT EXISTS (SELECT 1 FROM asset_dag_run_queue q WHERE q.asset_id = e.asset_id AND q.target_dag_id = r.dag_id)
ORDER BY 1, 2
"""
WATCHER_EVENTS = "SELECT count(*) FROM asset_event WHERE (extra::jsonb ->> 'from_trigger') = 'true'"
KINDS = ("trigger_flapping", "stranded_events", "double_bump", "split_partition")


def triggers_by_triggerer(logs: dict[str, Path]) -> dict[str, set[str]]:
    """The triggers each triggerer logged starting, by triggerer name."""
    out: dict[str, set[str]] = {}
    for name, path in logs.items():
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        out[name] = {m["name"] for line in lines if (m := STARTING.search(line))}
    return out


def family_report(
    db_url: str, run_dir: Path, triggerers: list[str], dupguard_logs: list[Path], files: int
) -> dict[str, Any]:
    started = triggers_by_triggerer({t: run_dir / f"{t}.log" for t in triggerers})
    names = sorted({n for s in started.values() for n in s})
    twice = [n for n in names if sum(n in s for s in started.values()) > 1]
    engine = create_engine(make_url(db_url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.connect() as conn:
            stranded = [dict(r._mapping) for r in conn.execute(text(STRANDED))]
            watcher_events = conn.execute(text(WATCHER_EVENTS)).scalar_one()
    finally:
        engine.dispose()
    log = [e for path in dupguard_logs for e in read_json_log(path)]
    said = {k: [e for e in log if e.get("event") == f"{k}_detected"] for k in KINDS}
    stranded_dags = sorted({r["dag_id"] for r in stranded})
    return {
        "truth": {
            "triggers_started": {t: sorted(s) for t, s in started.items()},
            "triggers_run_by_two_triggerers": twice,
            "watch_files_written": files,
            "watcher_asset_events": watcher_events,
            "stranded_events": stranded,
            "dags_with_stranded_events": stranded_dags,
        },
        "dupguard": {k: len(v) for k, v in said.items()},
        "dupguard_stranded_dags": sorted({d for e in said["stranded_events"] for d in e.get("dag_ids", [])}),
        "dupguard_observations": {k: [e.get("group_key") for e in v] for k, v in said.items() if v},
    }

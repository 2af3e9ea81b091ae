"""What Airflow recorded of the rest of the HA family (docs/explanation/checks.md) in one end-to-end run, and what
dupguard's periodic checks said of it: the truth never comes from dupguard's rules.

- **A trigger run by two triggerers** (trigger_flapping, trigger_event): each triggerer logs
  ``trigger <name> starting`` for every trigger it runs (``TriggerRunner.run_trigger``,
  airflow/jobs/triggerer_job_runner.py L1110 in 3.1.2); a trigger in the logs of two triggerers ran twice. The
  consequence is in ``asset_event``: the watcher's events (``extra.from_trigger``) against the files the harness wrote
  (one event each when one triggerer runs the trigger).
- **Asset events that trigger nothing** (stranded_events): an event of an asset a DAG is scheduled on that no run of
  that DAG consumed (``dagrun_asset_event``), although a run of that DAG was queued after it, with no
  queue row left for it (``asset_dag_run_queue``), read after the drain: stranded for good. And every
  event **passed over** (``PASSED_OVER``): the first asset-triggered run of its DAG created after it did
  not consume it; stranded from that run's creation until the DAG's next event queued it again
  (``next_event_at``; a later run consumed it, ``consumed_at``) or for good. Per event against the
  events of dupguard's ``stranded_events_detected`` lines (``judge_stranded``).
- dupguard: its ``<kind>_detected`` log lines (one per observation; the ledger claims each once).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
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
# Independent of detector.checks.stranded_events.rule. Holds for the harness's runs, where no consumer is paused or
# cleared (a clear rewrites queued_at; a paused DAG is not queued).
PASSED_OVER = """
WITH ev AS (
  SELECT r.dag_id, e.id AS event_id, e.timestamp,
    (SELECT dr.id FROM dag_run dr WHERE dr.dag_id = r.dag_id AND dr.run_type = 'asset_triggered'
       AND dr.queued_at > e.timestamp ORDER BY dr.queued_at, dr.id LIMIT 1) AS first_run
  FROM asset_event e JOIN dag_schedule_asset_reference r ON r.asset_id = e.asset_id
)
SELECT ev.dag_id, ev.event_id, ev.timestamp, fr.run_id AS passed_by, fr.queued_at AS passed_at,
  (SELECT min(n.timestamp) FROM asset_event n JOIN dag_schedule_asset_reference nr ON nr.asset_id = n.asset_id
     WHERE nr.dag_id = ev.dag_id AND n.timestamp > fr.queued_at) AS next_event_at,
  (SELECT min(dr.queued_at) FROM dagrun_asset_event c JOIN dag_run dr ON dr.id = c.dag_run_id
     WHERE c.event_id = ev.event_id AND dr.dag_id = ev.dag_id) AS consumed_at
FROM ev JOIN dag_run fr ON fr.id = ev.first_run
WHERE NOT EXISTS (SELECT 1 FROM dagrun_asset_event c WHERE c.event_id = ev.event_id AND c.dag_run_id = fr.id)
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


def judge_stranded(passed: list[dict[str, Any]], said: list[dict[str, Any]], end: datetime) -> dict[str, Any]:
    """dupguard's stranded events against the passed-over ones, per (DAG, event). ``observable_s``: how
    long dupguard's rule could see it (from the run that passed it over to the DAG's next event, or to
    ``end``): a set rescued sooner than the check's interval can be missed by design."""
    truth = {(r["dag_id"], r["event_id"]): r for r in passed}
    flagged = {(e.get("dag_id"), i) for e in said for i in e.get("event_ids", [])}

    def observable(key: tuple[str, int]) -> float:
        r = truth[key]
        seen: timedelta = (r["next_event_at"] or end) - r["passed_at"]
        return round(seen.total_seconds(), 1)

    missed = sorted(truth.keys() - flagged)
    return {
        "passed_over": len(truth),
        "passed_over_sets": len({(r["dag_id"], r["passed_by"]) for r in passed}),
        "rescued_later": sum(r["consumed_at"] is not None for r in passed),
        "observable_s": sorted(observable(k) for k in truth),
        "flagged": len(flagged),
        "true_positives": len(flagged & truth.keys()),
        "false_positives": [list(k) for k in sorted(flagged - truth.keys(), key=str)],
        "missed": [{"dag_id": d, "event_id": i, "observable_s": observable((d, i))} for d, i in missed],
    }


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
            passed = [dict(r._mapping) for r in conn.execute(text(PASSED_OVER))]
            watcher_events = conn.execute(text(WATCHER_EVENTS)).scalar_one()
    finally:
        engine.dispose()
    log = [e for path in dupguard_logs for e in read_json_log(path)]
    said = {k: [e for e in log if e.get("event") == f"{k}_detected"] for k in KINDS}
    stranded_dags = sorted({r["dag_id"] for r in stranded})
    judged = judge_stranded(passed, said["stranded_events"], datetime.now(UTC))
    return {
        "truth": {
            "triggers_started": {t: sorted(s) for t, s in started.items()},
            "triggers_run_by_two_triggerers": twice,
            "watch_files_written": files,
            "watcher_asset_events": watcher_events,
            "stranded_events": stranded,
            "dags_with_stranded_events": stranded_dags,
            "passed_over_events": passed,
        },
        "stranded_judged": judged,
        "dupguard": {k: len(v) for k, v in said.items()},
        "dupguard_stranded_dags": sorted({d for e in said["stranded_events"] for d in e.get("dag_ids", [])}),
        "dupguard_observations": {k: [e.get("group_key") for e in v] for k, v in said.items() if v},
    }

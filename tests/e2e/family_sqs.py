"""What Airflow recorded of the SQS AssetWatcher run by two triggerers (``tests/e2e/dags_sqs``),
and what dupguard's ``trigger_event`` kind said of it: the truth never comes from dupguard's rules.

- **Truth, from Airflow's records only**: the watcher's asset events (``extra.from_trigger``) and the
  ``MessageId`` of every message of their ``payload.message_batch``; the runs of ``consumer_sqs`` that
  consumed them (``dagrun_asset_event``, ``dag_run``). A message with events consumed by two or more
  runs was processed twice: those runs are a duplicate group; groups sharing a run form a chain.
- **Who ran the trigger**: each triggerer's ``Trigger fired event`` lines (``TriggerRunner.run_trigger``,
  airflow/jobs/triggerer_job_runner.py L1114 in 3.1.2) carry the event's payload, hence its ids.
- **dupguard**: its ``duplicate_detected`` lines for ``consumer_sqs``, of kind ``trigger_event`` and of kind
  ``asset`` (two runs of one queue row that consumed one copy; the runs of one group key merged across
  observations), and its remediation outcomes for the ``trigger_event`` groups.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.e2e.harness import read_json_log

DAG = "consumer_sqs"
ASSET = "test://e2e-sqs-asset"  # the asset's name; Airflow stores its uri normalised (a "/" added)
FIRED_ID = re.compile(r"MessageId\\?': \\?'([0-9A-Za-z-]+)")  # in the event's repr, quoted in the log line
EVENTS = """
SELECT e.id AS event_id, e.timestamp, m ->> 'MessageId' AS message_id
FROM asset_event e
JOIN asset a ON a.id = e.asset_id
CROSS JOIN LATERAL jsonb_array_elements(COALESCE(e.extra::jsonb -> 'payload' -> 'message_batch', '[]'::jsonb)) m
WHERE a.name = :name AND (e.extra::jsonb ->> 'from_trigger') = 'true'
ORDER BY e.id
"""
CONSUMED = """
SELECT c.event_id, dr.run_id, dr.state
FROM dagrun_asset_event c JOIN dag_run dr ON dr.id = c.dag_run_id
WHERE dr.dag_id = :dag
"""


def fired_by_triggerer(logs: dict[str, Path]) -> dict[str, list[str]]:
    """The message ids in each triggerer's ``Trigger fired event`` lines."""
    out: dict[str, list[str]] = {}
    for name, path in logs.items():
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        out[name] = [mid for line in lines if "Trigger fired event" in line for mid in FIRED_ID.findall(line)]
    return out


def truth_groups(
    events: list[dict[str, Any]], consumed: dict[int, set[str]]
) -> tuple[list[set[str]], list[set[str]], dict[str, Any]]:
    """From ``events`` (event_id, message_id rows) and ``consumed`` (event id -> the runs that consumed
    it): the duplicate groups (per message id, the runs that consumed its events, where two or more
    did; one group per distinct set of runs), the chains they form (runs linked through groups that
    share a run: run 2 consumed message 1's second copy and message 2's first), and per-message counts."""
    events_of: dict[str, set[int]] = defaultdict(set)
    for row in events:
        events_of[row["message_id"]].add(row["event_id"])
    runs_of = {mid: set().union(*(consumed.get(e, set()) for e in evs)) for mid, evs in events_of.items()}
    twice = [runs for runs in runs_of.values() if len(runs) > 1]
    groups = sorted({frozenset(r) for r in twice}, key=sorted)
    chains: list[set[str]] = []
    for g in groups:
        touching = [c for c in chains if c & g]
        merged = set(g).union(*touching)
        chains = [c for c in chains if not c & g] + [merged]
    counts = {
        "messages_with_events": len(events_of),
        "copies": sum(len(e) - 1 for e in events_of.values()),
        "messages_with_two_or_more_events": sum(len(e) > 1 for e in events_of.values()),
        "messages_consumed_by_two_or_more_runs": len(twice),
        "messages_consumed_by_no_run": sorted(mid for mid, runs in runs_of.items() if not runs),
    }
    return [set(g) for g in groups], sorted(chains, key=sorted), counts


def judge(truth: list[set[str]], said: list[dict[str, Any]]) -> dict[str, Any]:
    """dupguard's ``trigger_event`` groups (``duplicate_detected`` lines, the runs of one group key merged
    across observations) against the truth's, by run ids. A group said is right when it is one truth
    group (``exact``) or a union of truth groups that share runs (``merged``: a chain or part of one);
    any other is a false positive. A truth group inside no group said is missed."""
    merged: dict[str, set[str]] = defaultdict(set)
    for e in said:
        merged[e.get("group_key", "")] |= {r["run_id"] for r in e.get("runs", [])}
    exact: list[str] = []
    unions: list[str] = []
    false: list[dict[str, Any]] = []
    for key, runs in sorted(merged.items()):
        inside = [g for g in truth if g <= runs]
        if runs in truth:
            exact.append(key)
        elif inside and set().union(*inside) == runs and _connected(inside):
            unions.append(key)
        else:
            false.append({"group_key": key, "runs": sorted(runs)})
    return {
        "groups_said": len(merged),
        "exact": len(exact),
        "merged": unions,
        "false_positives": false,
        "missed": [sorted(g) for g in truth if not any(g <= runs for runs in merged.values())],
    }


def _connected(groups: list[set[str]]) -> bool:
    reached = set(groups[0])
    left = groups[1:]
    while left:
        touching = [g for g in left if g & reached]
        if not touching:
            return False
        reached = reached.union(*touching)
        left = [g for g in left if not g & reached]
    return True


def sqs_report(
    db_url: str, run_dir: Path, triggerers: list[str], dupguard_logs: list[Path], sent: list[dict[str, Any]]
) -> dict[str, Any]:
    engine = create_engine(make_url(db_url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.connect() as conn:
            events = [dict(r._mapping) for r in conn.execute(text(EVENTS), {"name": ASSET})]
            consumed_rows = [dict(r._mapping) for r in conn.execute(text(CONSUMED), {"dag": DAG})]
    finally:
        engine.dispose()
    consumed: dict[int, set[str]] = defaultdict(set)
    for row in consumed_rows:
        consumed[row["event_id"]].add(row["run_id"])
    succeeded = {row["run_id"] for row in consumed_rows if row["state"] == "success"}
    # A message none of whose runs succeeded was not processed (a stop that lost it, or a failure).
    unprocessed = {row["message_id"] for row in events} - {
        row["message_id"] for row in events if consumed.get(row["event_id"], set()) & succeeded
    }
    groups, chains, counts = truth_groups(events, consumed)
    log = [e for path in dupguard_logs for e in read_json_log(path)]
    # Every kind's groups: two runs of one queue row (the schedulers' race, kind asset) that consumed
    # one copy are a message processed twice too.
    said = [e for e in log if e.get("event") == "duplicate_detected" and e.get("dag_id") == DAG]
    fired = fired_by_triggerer({t: run_dir / f"{t}.log" for t in triggerers})
    sent_ids = {m["message_id"] for m in sent}
    seen_ids = {row["message_id"] for row in events}
    event_ids = {row["event_id"] for row in events}
    return {
        "truth": {
            "messages_sent": len(sent),
            "events": len(event_ids),
            **counts,
            "messages_sent_without_event": sorted(sent_ids - seen_ids),
            "ids_not_sent": sorted(seen_ids - sent_ids),
            "consumer_runs": len({r["run_id"] for r in consumed_rows}),
            "events_consumed_by_no_run": len(event_ids - consumed.keys()),
            "consumer_run_states": dict(Counter(r["state"] for r in {x["run_id"]: x for x in consumed_rows}.values())),
            "messages_no_successful_run_processed": sorted(unprocessed),
            "duplicate_groups": [sorted(g) for g in groups],
            "chains": [sorted(c) for c in chains if len(c) > 2],
            "runs_in_groups": len(set().union(*groups)) if groups else 0,
            "fired_by_triggerer": {t: len(ids) for t, ids in fired.items()},
            "fired_by_both": len(set.intersection(*(set(ids) for ids in fired.values()))) if fired else 0,
        },
        "dupguard": judge(groups, said)
        | {
            "kinds": dict(Counter({str(e.get("group_key")): str(e.get("kind")) for e in said}.values())),
            # per group key, its last observation's confidence (a group grows and may be confirmed later)
            "confidence": dict(Counter({str(e.get("group_key")): str(e.get("confidence")) for e in said}.values())),
            "remediation_results": dict(
                Counter(
                    str(res.get("result"))
                    for e in log
                    if e.get("event") == "remediation_outcome"
                    and str(e.get("group_key", "")).startswith("trigger_event|")
                    for res in e.get("results", [])
                )
            ),
        },
    }

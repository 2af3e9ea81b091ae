"""Ground truth after an end-to-end run, from the database itself, next to what dupguard logged.

Independent of dupguard's code and of its rule on purpose: the duplicate groups come from what
Airflow recorded about each asset event (``RUN_KEYS``: every ``asset_triggered`` run, its consumed
events in ``dagrun_asset_event``, its ``creating_job_id``), judged by ``duplicate_groups`` against what
Airflow promises: **one run per event per consumer DAG** (per partition key for partitioned runs, where
one event may legitimately map to several keys). An event consumed by two or more runs of one DAG
(and key) was processed more than once, whatever the runs' ``run_after``; those runs, and every run
linked to them through another event consumed more than once, form one group. No run_after or
event-set equality is used, so a wrong detector rule shows up as a missed group or a false
positive. Also read from the database: whether a
run's tasks started from ``task_instance`` / ``task_instance_history`` states, who touched a
run from its ``dag_run_note`` (dupguard's sidecar note starts ``dupguard stopped``, the guard's
``dupguard guard skipped``). dupguard's side comes only from its JSON log:
``duplicate_detected`` (``dag_id``, ``runs``, ``kept_run``, ``confidence``, ``detected_at``) and
``remediation_outcome`` (``results[]``: ``run_id``, ``result``, ``committed_at``).

Terms in the report:

* a group's **kept run** is the run nobody stopped (when exactly one is left); the others are its
  **duplicates**. If several were left, the kept run is the lowest id among those whose tasks ran
  (dupguard's keep rule), else the lowest id;
* a duplicate is **stopped before start** when no task instance of it ever reached running (or a
  later state: success, failed, up_for_retry, ...) and it carries a dupguard note (sidecar) or the
  guard's note (**prevented**); **detected but ran** when its group was detected but a task ran;
  **missed** when the group was never detected (and the guard did not prevent it);
* **catch rate** = (prevented + stopped before start) / duplicates; among the detected but ran,
  ``remediated_then_ran`` counts those whose remediation was committed *before* their first task
  started (Airflow overwrote it) and ``remediated_after_start`` those committed after;
* **remediations of kept runs** = runs touched by dupguard that were not duplicates: outside every
  group, the run dupguard itself logged as kept, or the last run of a group whose every run was touched;
* **latency** = the duplicate's ``queued_at`` (its creation) to the committed remediation:
  ``dag_run.end_date`` for ``fail``; the first ``end_date`` of its skipped task instances for
  ``skip`` (the note's ``created_at`` if none), over every duplicate dupguard stopped (a task can
  start between dupguard's re-read and an API call; such a run counts as detected but ran, its
  latency is still a latency); the **deadline** of the same run is ``queued_at``
  to the first ``start_date`` of a task instance that really started, over every consumer run that ran.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url

from detector.core.model import STARTED_TI_STATES
from tests.e2e.harness import RunSpec, read_json_log

# dupguard's one definition of a started state (docs/explanation/remediation.md "What counts as started"); the
# judge below also asks for a start_date, to tell a task Airflow failed while queued from one that ran
STARTED = tuple(sorted(STARTED_TI_STATES))
SIDECAR_NOTE = "dupguard stopped"
GUARD_NOTE = "dupguard guard skipped"
CAUGHT = ("stopped_before_start", "prevented_by_guard")

# What Airflow recorded for the ground truth: every asset-triggered run with the events it consumed
# and the scheduler job that created it. Also the near misses (same run_after, different events).
RUN_KEYS = """
SELECT dr.id, dr.dag_id, dr.run_id, dr.run_after, dr.creating_job_id, {partition_key} AS partition_key,
       COALESCE((SELECT array_agg(e.event_id ORDER BY e.event_id)
                 FROM dagrun_asset_event e WHERE e.dag_run_id = dr.id), '{{}}') AS events
FROM dag_run dr
WHERE dr.run_type = 'asset_triggered'
"""
HAS_PARTITION_KEY = """
SELECT count(*) FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = 'dag_run' AND column_name = 'partition_key'
"""
SAME_RUN_AFTER_DIFFERENT_EVENTS = """
SELECT count(*) FROM (
    SELECT dr.dag_id, dr.run_after FROM dag_run dr WHERE dr.run_type = 'asset_triggered'
    GROUP BY dr.dag_id, dr.run_after HAVING count(*) > 1
       AND count(DISTINCT (SELECT array_agg(e.event_id ORDER BY e.event_id)
                           FROM dagrun_asset_event e WHERE e.dag_run_id = dr.id)) > 1
) x
"""
TRIGGER_EVENTS = """
SELECT count(*) FROM asset_event WHERE (extra::jsonb ->> 'from_trigger') = 'true'
"""
RUNS = """
SELECT dr.id, dr.dag_id, dr.run_id, dr.state, dr.queued_at, dr.start_date, dr.end_date,
       n.content AS note, n.created_at AS note_at
FROM dag_run dr LEFT JOIN dag_run_note n ON n.dag_run_id = dr.id
WHERE dr.run_type = 'asset_triggered'
"""
# The lead of each asset-triggered run: its creation (``queued_at``) after the earliest event it consumed.
# The queue row Airflow inserts with an event keeps the first event's time (``ON CONFLICT DO NOTHING``),
# so this is how long the row stood before a scheduler turned it into this run (the poll at rest,
# detector/core/pace.py, needs it longer than its rest interval to meet the race polling fast).
QUEUE_LEADS = """
SELECT EXTRACT(EPOCH FROM dr.queued_at - min(e.timestamp)) * 1000 AS lead_ms
FROM dag_run dr JOIN dagrun_asset_event d ON d.dag_run_id = dr.id JOIN asset_event e ON e.id = d.event_id
WHERE dr.run_type = 'asset_triggered' AND dr.queued_at IS NOT NULL
GROUP BY dr.id, dr.queued_at
"""
TIS = """
SELECT dag_id, run_id, task_id, state, start_date, end_date FROM task_instance
WHERE run_id LIKE 'asset_triggered__%'
"""
TI_HISTORY = """
SELECT DISTINCT dag_id, run_id FROM task_instance_history
WHERE run_id LIKE 'asset_triggered__%' AND state = ANY(:started) AND start_date IS NOT NULL
"""


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    """n, min, p50, p90, p99, max (nearest rank), in the unit given."""
    if not values:
        return {"n": 0, "min": None, "p50": None, "p90": None, "p99": None, "max": None}
    v = sorted(values)

    def rank(p: float) -> float:
        return round(v[max(0, math.ceil(p / 100 * len(v)) - 1)], 1)

    return {"n": len(v), "min": round(v[0], 1), "p50": rank(50), "p90": rank(90), "p99": rank(99), "max": rank(100)}


def _ms(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return (later - earlier).total_seconds() * 1000.0


def _parse(ts: str | None) -> datetime | None:
    return datetime.fromisoformat(ts) if ts else None


def duplicate_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs (``id``, ``dag_id``, ``partition_key``, ``events``, optional ``creating_job_id``) that
    consumed an asset event another run of the same DAG (and partition key) consumed too, grouped by
    those events (transitively). Each group: ``dag_id``, ``partition_key``, ``ids`` ascending,
    ``events`` (the ones consumed more than once), ``creating_job_ids`` (by id). Ordered by lowest id."""
    consumers: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    by_id = {r["id"]: r for r in rows}
    for r in rows:
        for event in set(r["events"] or ()):
            consumers[(r["dag_id"], r.get("partition_key"), event)].append(r["id"])
    parent = {rid: rid for rid in by_id}

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    twice: dict[int, set[int]] = defaultdict(set)  # run id -> its events consumed more than once
    for (_, _, event), ids in consumers.items():
        if len(ids) < 2:
            continue
        for rid in ids:
            twice[rid].add(event)
            parent[root(rid)] = root(ids[0])
    members: dict[int, list[int]] = defaultdict(list)
    for rid in twice:
        members[root(rid)].append(rid)
    groups = []
    for ids in members.values():
        ids.sort()
        first = by_id[ids[0]]
        groups.append(
            {
                "dag_id": first["dag_id"],
                "partition_key": first.get("partition_key"),
                "ids": ids,
                "events": sorted(set().union(*(twice[i] for i in ids))),
                "creating_job_ids": [by_id[i].get("creating_job_id") for i in ids],
                # more than one run_after: the overlap race (a stale read of one asset's queue row)
                "overlap": len({by_id[i].get("run_after") for i in ids}) > 1,
            }
        )
    return sorted(groups, key=lambda g: g["ids"][0])


def read_consumptions(conn: Connection) -> list[dict[str, Any]]:
    """Every asset-triggered run with its consumed events and creating job (``RUN_KEYS``)."""
    partitioned = conn.execute(text(HAS_PARTITION_KEY)).scalar_one() > 0
    keys = RUN_KEYS.format(partition_key="dr.partition_key" if partitioned else "NULL")
    return [dict(r._mapping) for r in conn.execute(text(keys))]


def read_groups(conn: Connection, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """The ground-truth groups of the database behind ``conn``; each also lists its ``run_ids``."""
    rows = read_consumptions(conn) if rows is None else rows
    run_ids = {r["id"]: r["run_id"] for r in rows}
    groups = duplicate_groups(rows)
    for g in groups:
        g["run_ids"] = [run_ids[i] for i in g["ids"]]
    return groups


def analyse(
    db_url: str, dupguard_logs: Path | list[Path], spec: RunSpec, *, faults: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The report of one run. ``dupguard_logs``: every log of every replica (incarnations of a replica
    killed and restarted included); ``faults``: what the harness did (``Cluster.faults``)."""
    engine = create_engine(make_url(db_url).set(drivername="postgresql+psycopg2"))
    try:
        with engine.connect() as conn:
            events = conn.execute(text("SELECT count(*) FROM asset_event")).scalar_one()
            # asset events the triggerer created for an AssetWatcher (Trigger.submit_event's extra)
            trigger_events = conn.execute(text(TRIGGER_EVENTS)).scalar_one()
            producer_runs = conn.execute(
                text("SELECT count(*) FROM dag_run WHERE dag_id = :p"), {"p": spec.producer}
            ).scalar_one()
            consumptions = read_consumptions(conn)
            groups = read_groups(conn, consumptions)
            near_misses = conn.execute(text(SAME_RUN_AFTER_DIFFERENT_EVENTS)).scalar_one()
            runs = {r.id: dict(r._mapping) for r in conn.execute(text(RUNS))}
            tis = [dict(r._mapping) for r in conn.execute(text(TIS))]
            history = {(r.dag_id, r.run_id) for r in conn.execute(text(TI_HISTORY), {"started": list(STARTED)})}
            leads = [float(r.lead_ms) for r in conn.execute(text(QUEUE_LEADS))]
    finally:
        engine.dispose()
    paths = [dupguard_logs] if isinstance(dupguard_logs, Path) else dupguard_logs
    log = [e for path in paths for e in read_json_log(path)]
    report = judge(events, producer_runs, groups, near_misses, runs, tis, history, log, spec, consumptions)
    report["asset_events_from_trigger"] = trigger_events
    report["queue_lead_ms"] = percentiles(leads)
    report["samples_ms"]["queue_lead"] = [round(x, 1) for x in leads]
    report |= judge_faults(report, faults or [], log)
    return report


def _takes_over(event: dict[str, Any]) -> bool:
    return event.get("event") == "leader_acquired" or (
        event.get("event") == "watching" and event.get("source") == "api"
    )


def judge_faults(report: dict[str, Any], faults: list[dict[str, Any]], log: list[dict[str, Any]]) -> dict[str, Any]:
    """What the faults did. Leader kills: the time from each SIGKILL to the next ``leader_acquired``
    logged by any replica (the takeover); the REST API source takes no lock, so its one replica's
    takeover is its restart's ``watching``. API outage (``api_down`` .. ``api_ready``): every duplicate
    created before the API server answered again whose tasks had not started by then must be stopped
    before they start (``outage.not_started_at_return`` vs ``outage.stopped_before_start``). A task
    whose ``start_date`` falls inside the outage had not started either: ``start_date`` is the
    worker's clock when it first tried ``ti_run``, which it retried until the API server answered."""
    out: dict[str, Any] = {}
    acquired = sorted(t for e in log if _takes_over(e) and (t := _parse(e.get("timestamp"))))
    kills = [_parse(f["at"]) for f in faults if f["what"] == "leader_killed"]
    takeovers = []
    for k in kills:
        after = [t for t in acquired if k is not None and t > k]
        takeovers.append(_ms(after[0], k) if after else None)
    out["leader_kills"] = len(kills)
    out["takeover_ms"] = percentiles([t for t in takeovers if t is not None])
    out["kills_without_takeover"] = sum(t is None for t in takeovers)
    down = next((_parse(f["at"]) for f in faults if f["what"] == "api_down"), None)
    ready = next((_parse(f["at"]) for f in faults if f["what"] == "api_ready"), None)
    if down is not None and ready is not None:
        created = [d for d in report["duplicates"] if d["queued_at"] is not None and d["queued_at"] <= ready]
        waiting = [d for d in created if d["first_task_start"] is None or d["first_task_start"] >= down]
        during = [d for d in created if d["queued_at"] >= down]
        out["outage"] = {
            "down_at": down,
            "ready_at": ready,
            "unavailable_s": round((ready - down).total_seconds(), 1),
            "duplicates_created_during": len(during),
            "not_started_at_return": len(waiting),
            "stopped_before_start": sum(d["category"] in CAUGHT for d in waiting),
            # not stopped by dupguard, yet no task ran (Airflow failed the task it could not start)
            "not_run_not_stopped": sum(d["category"] == "not_started_not_stopped" for d in waiting),
            "ran": [
                {"dag_id": d["dag_id"], "run_id": d["run_id"], "category": d["category"]}
                for d in waiting
                if d["category"] in ("detected_but_ran", "missed")
            ],
        }
    return out


def judge(
    events: int,
    producer_runs: int,
    groups: list[dict[str, Any]],
    near_misses: int,
    runs: dict[int, dict[str, Any]],
    tis: list[dict[str, Any]],
    history: set[tuple[str, str]],
    log: list[dict[str, Any]],
    spec: RunSpec,
    consumptions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    by_run_id = {(r["dag_id"], r["run_id"]): rid for rid, r in runs.items()}
    tis_of: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for ti in tis:
        rid = by_run_id.get((ti["dag_id"], ti["run_id"]))
        if rid is not None:
            tis_of[rid].append(ti)

    def started(rid: int) -> bool:
        r = runs[rid]
        # A start_date too: a task the executor reported failed before its ti_run (e.g. the worker
        # could not reach the Execution API) is marked failed by the scheduler with no start_date
        # (scheduler_job_runner.py _process_executor_events, "finished with state failed, but the
        # task instance's state attribute is queued"): it never ran.
        return (r["dag_id"], r["run_id"]) in history or any(
            t["state"] in STARTED and t["start_date"] is not None for t in tis_of[rid]
        )

    def first_start(rid: int) -> datetime | None:
        starts = [t["start_date"] for t in tis_of[rid] if t["state"] in STARTED and t["start_date"]]
        return min(starts) if starts else None

    def note(rid: int) -> str:
        return runs[rid]["note"] or ""

    # dupguard's view, from its log
    # trigger_event groups share no event and no run_after by design, and their runs are in no asset
    # group: the groups and their stops are judged against the messages in tests/e2e/family_sqs.py
    copies_said = [e for e in log if e.get("event") == "duplicate_detected" and e.get("kind") == "trigger_event"]
    copy_runs = {by_run_id.get((e["dag_id"], r["run_id"])) for e in copies_said for r in e.get("runs", [])}
    detected = [e for e in log if e.get("event") == "duplicate_detected" and e.get("kind") != "trigger_event"]
    outcomes = [
        e
        for e in log
        if e.get("event") == "remediation_outcome" and not str(e.get("group_key", "")).startswith("trigger_event|")
    ]
    remediation_lines = [e for e in log if e.get("event") == "remediation"]
    logged_done: dict[int, datetime | None] = {}
    for e in outcomes:
        for res in e.get("results", []):
            rid = by_run_id.get((e["dag_id"], res["run_id"]))
            if rid is not None and res.get("result") == "done":
                logged_done[rid] = _parse(res.get("committed_at"))
    logged_kept = {by_run_id.get((e["dag_id"], e["kept_run"])) for e in detected} - {None}

    sidecar_touched = ({rid for rid in runs if note(rid).startswith(SIDECAR_NOTE)} | set(logged_done)) - copy_runs
    guard_touched = {rid for rid in runs if note(rid).startswith(GUARD_NOTE)}
    touched = sidecar_touched | guard_touched

    member_of: dict[int, int] = {}
    for gi, g in enumerate(groups):
        for rid in g["ids"]:
            member_of[rid] = gi

    # detection: recall and false positives (by run ids, not by dupguard's keys)
    detected_runs_of: dict[int, set[int]] = defaultdict(set)
    false_positives = []
    for e in detected:
        rids = {by_run_id.get((e["dag_id"], r["run_id"])) for r in e.get("runs", [])}
        gis = {member_of.get(rid) for rid in rids}
        if None in rids or None in gis or len(gis) != 1:
            false_positives.append({"dag_id": e["dag_id"], "runs": [r["run_id"] for r in e.get("runs", [])]})
            continue
        gi = gis.pop()
        assert gi is not None
        detected_runs_of[gi] |= {rid for rid in rids if rid is not None}
    detected_groups = {gi for gi, g in enumerate(groups) if set(g["ids"]) <= detected_runs_of[gi]}
    confidences = defaultdict(int)
    for e in detected:
        confidences[e.get("confidence", "?")] += 1

    # actions on kept runs
    kept_violations = []
    for rid in sorted(sidecar_touched):
        if rid not in member_of:
            kept_violations.append({"run_id": runs[rid]["run_id"], "why": "not in any duplicate group"})
        elif rid in logged_kept:
            kept_violations.append({"run_id": runs[rid]["run_id"], "why": "dupguard's own kept run"})
    for g in groups:
        if all(rid in touched for rid in g["ids"]):
            kept_violations.append({"run_id": runs[g["ids"][-1]]["run_id"], "why": "every run of its group stopped"})
    # One run per event per consumer DAG (and key) must survive: an event whose every consumer run was
    # stopped is lost, even when another run of its group survived (e.g. the run that consumed fewer
    # events kept and the one holding every event stopped).
    consumers: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for row in consumptions or []:
        for event in set(row["events"] or ()):
            consumers[(row["dag_id"], row.get("partition_key"), event)].append(row["id"])
    lost = sorted(
        ((k, ids) for k, ids in consumers.items() if all(rid in touched for rid in ids)),
        key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2]),
    )
    for (dag_id, _, event), ids in lost:
        why = f"every run of {dag_id} that consumed event {event} stopped"
        kept_violations.append({"run_id": runs[min(ids)]["run_id"], "why": why})
    guard_outside = sorted(runs[rid]["run_id"] for rid in guard_touched if rid not in member_of)

    # per duplicate
    per_dup: list[dict[str, Any]] = []
    counts: dict[str, int] = defaultdict(int)
    latency: list[float] = []
    latency_log: list[float] = []
    for gi, g in enumerate(groups):
        ids = list(g["ids"])
        left = [rid for rid in ids if rid not in touched]
        if len(left) == 1:
            kept = left[0]
        else:
            pool = left or ids
            ran = [rid for rid in pool if started(rid)]
            kept = min(ran or pool)
        for rid in ids:
            if rid == kept:
                continue
            r = runs[rid]
            ran = started(rid)
            if rid in guard_touched and not ran:
                cat = "prevented_by_guard"
            elif rid in sidecar_touched and not ran:
                cat = "stopped_before_start"
            elif gi in detected_groups and ran:
                cat = "detected_but_ran"
            elif gi not in detected_groups and rid not in guard_touched:
                cat = "missed"
            else:
                cat = "not_started_not_stopped"
                if any(t["state"] == "failed" for t in tis_of[rid]):
                    counts["failed_by_airflow_before_start"] += 1
            counts[cat] += 1
            committed = None
            first = first_start(rid)
            if rid in sidecar_touched:
                if spec.mode == "fail" and r["state"] == "failed":
                    committed = r["end_date"]
                else:
                    ends = [t["end_date"] for t in tis_of[rid] if t["state"] == "skipped" and t["end_date"]]
                    committed = min(ends) if ends else r["note_at"]
                ms = _ms(committed, r["queued_at"])
                if ms is not None:
                    latency.append(ms)
                if cat == "detected_but_ran" and committed is not None and first is not None:
                    # committed before the task started, yet it ran: Airflow overwrote the change
                    # (e.g. schedule_tis' unguarded UPDATE ... SET state='scheduled' after an API skip)
                    counts["remediated_then_ran" if committed < first else "remediated_after_start"] += 1
                log_ms = _ms(logged_done.get(rid), r["queued_at"])
                if log_ms is not None:
                    latency_log.append(log_ms)
            per_dup.append(
                {
                    "dag_id": r["dag_id"],
                    "run_id": r["run_id"],
                    "kept_run_id": runs[kept]["run_id"],
                    "category": cat,
                    "queued_at": r["queued_at"],
                    "first_task_start": first,
                    "remediation_committed": committed,
                    "latency_ms": _ms(committed, r["queued_at"]),
                }
            )

    # detection latency: queued_at of the last run of the group -> detected_at
    detection_latency = []
    for e in detected:
        qs = [_parse(r.get("queued_at")) for r in e.get("runs", [])]
        qs = [q for q in qs if q]
        det = _parse(e.get("detected_at"))
        if qs and det:
            detection_latency.append((det - max(qs)).total_seconds() * 1000.0)

    # the deadline: creation -> first task start, for every consumer run whose tasks ran
    deadline_all, deadline_serial = [], []
    for rid, r in runs.items():
        fs = first_start(rid)
        if fs is None or r["queued_at"] is None:
            continue
        ms = _ms(fs, r["queued_at"])
        assert ms is not None
        (deadline_serial if r["dag_id"] == "consumer_serial" else deadline_all).append(ms)
    by_dag = defaultdict(lambda: defaultdict(int))
    for d in per_dup:
        by_dag[d["dag_id"]][d["category"]] += 1

    duplicates = len(per_dup)
    caught = counts["prevented_by_guard"] + counts["stopped_before_start"]
    results_count: dict[str, int] = defaultdict(int)
    for e in remediation_lines:
        results_count[str(e.get("result"))] += 1
    return {
        "spec": spec.__dict__,
        "fault_injection": bool(spec.fault_max_ms),
        "asset_events": events,
        "producer_runs": producer_runs,
        "consumer_runs": len(runs),
        "duplicate_groups": len(groups),
        # an HA race has one creating job per run; a group made by one job is another kind of defect
        "duplicate_groups_one_creating_job": sum(len(set(g.get("creating_job_ids") or [None, 0])) == 1 for g in groups),
        "duplicate_runs": duplicates,
        "overlap_groups": sum(bool(g.get("overlap")) for g in groups),
        "same_run_after_different_events": near_misses,
        "groups_detected": len(detected_groups),
        "recall": (len(detected_groups) / len(groups)) if groups else None,
        "undetected_groups": [
            [runs[i]["run_id"] for i in g["ids"]] for gi, g in enumerate(groups) if gi not in detected_groups
        ],
        "detected_log_events": len(detected),
        "detected_confidence": dict(confidences),
        "false_positives": len(false_positives),
        "false_positive_details": false_positives,
        "remediations_of_kept_runs": len(kept_violations),
        "event_consumers": len(consumers),
        "events_consumed_more_than_once": sum(len(ids) > 1 for ids in consumers.values()),
        "events_lost_by_stopping": len(lost),
        "kept_run_violations": kept_violations,
        "guard_notes_outside_groups": guard_outside,
        "prevented_by_guard": counts["prevented_by_guard"],
        "stopped_before_start": counts["stopped_before_start"],
        "detected_but_ran": counts["detected_but_ran"],
        "missed": counts["missed"],
        "remediated_then_ran": counts["remediated_then_ran"],
        "remediated_after_start": counts["remediated_after_start"],
        # dupguard logged result "done" (a clean stop) for a run a task of which had started: a
        # mid-run stop reported as clean. Must be 0.
        "done_but_started": sorted(runs[rid]["run_id"] for rid in logged_done if started(rid)),
        "not_started_not_stopped": counts["not_started_not_stopped"],
        "failed_by_airflow_before_start": counts["failed_by_airflow_before_start"],
        "catch_rate": (caught / duplicates) if duplicates else None,
        "by_dag": {k: dict(v) for k, v in by_dag.items()},
        "remediation_results": dict(results_count),
        "latency_ms": percentiles(latency),
        "latency_log_committed_ms": percentiles(latency_log),
        "detection_latency_ms": percentiles(detection_latency),
        "deadline_ms": percentiles(deadline_all),
        "deadline_serial_ms": percentiles(deadline_serial),
        # raw samples, so that repetitions of a cell can be pooled (benchmarks/e2e_catch_rate.py)
        "samples_ms": {
            "latency": [round(x, 1) for x in latency],
            "detection": [round(x, 1) for x in detection_latency],
            "deadline": [round(x, 1) for x in deadline_all],
        },
        "duplicates": per_dup,
    }


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def summary_line(report: dict[str, Any]) -> str:
    """One human line per run (the test prints it; the benchmark's table has the same figures)."""
    lat, dl = report["latency_ms"], report["deadline_ms"]
    return (
        f"e2e {report['spec']['name']}: events={report['asset_events']} consumer_runs={report['consumer_runs']} "
        f"groups={report['duplicate_groups']} detected={report['groups_detected']} "
        f"false_positives={report['false_positives']} kept_runs_touched={report['remediations_of_kept_runs']} | "
        f"duplicates={report['duplicate_runs']} prevented_by_guard={report['prevented_by_guard']} "
        f"stopped_before_start={report['stopped_before_start']} detected_but_ran={report['detected_but_ran']} "
        f"missed={report['missed']} catch_rate={_pct(report['catch_rate'])} | "
        f"latency p50/p99={lat['p50']}/{lat['p99']} ms deadline p50/p99={dl['p50']}/{dl['p99']} ms "
        f"(fault injection {'on' if report['fault_injection'] else 'off'})" + _fault_summary(report)
    )


def _fault_summary(report: dict[str, Any]) -> str:
    parts = []
    if report.get("leader_kills"):
        t = report["takeover_ms"]
        parts.append(f"leader kills={report['leader_kills']} takeover p50/max={t['p50']}/{t['max']} ms")
    if "outage" in report:
        o = report["outage"]
        parts.append(
            f"API outage {o['unavailable_s']} s: duplicates waiting at return={o['not_started_at_return']} "
            f"stopped={o['stopped_before_start']} not run (Airflow failed them)={o['not_run_not_stopped']} "
            f"ran={len(o['ran'])}"
        )
    if report.get("failed_by_airflow_before_start"):
        parts.append(f"failed by Airflow before start={report['failed_by_airflow_before_start']}")
    return (" | " + "; ".join(parts)) if parts else ""

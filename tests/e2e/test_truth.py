"""The end-to-end judge (``tests/e2e/truth.judge``) on hand-made rows: no Airflow, no database.

The e2e test's hard guarantees are only as good as this bookkeeping, so each category is pinned
here: the grouping rule (run_after, or partition_key for partitioned runs), stopped before start,
prevented by the guard, detected but ran, missed, false positive,
and the three ways a kept run can be touched.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.e2e.harness import RunSpec
from tests.e2e.truth import GUARD_NOTE, SIDECAR_NOTE, duplicate_groups, judge, judge_faults, percentiles

T0 = datetime(2026, 11, 30, 4, 0, tzinfo=UTC)


def ms(n: float) -> datetime:
    return T0 + timedelta(milliseconds=n)


def run(
    rid: int, dag: str, *, state: str = "success", note: str | None = None, end: float | None = None
) -> dict[str, Any]:
    return {
        "id": rid,
        "dag_id": dag,
        "run_id": f"asset_triggered__r{rid}",
        "state": state,
        "queued_at": ms(0),
        "start_date": ms(10),
        "end_date": ms(end) if end is not None else ms(900),
        "note": note,
        "note_at": ms(end) if end is not None else None,
    }


def ti(rid: int, dag: str, state: str, start: float | None, end: float | None = None) -> dict[str, Any]:
    return {
        "dag_id": dag,
        "run_id": f"asset_triggered__r{rid}",
        "task_id": "t",
        "state": state,
        "start_date": ms(start) if start is not None else None,
        "end_date": ms(end) if end is not None else None,
    }


def detected(dag: str, *rids: int, kept: int) -> dict[str, Any]:
    return {
        "event": "duplicate_detected",
        "dag_id": dag,
        "kept_run": f"asset_triggered__r{kept}",
        "confidence": "confirmed",
        "detected_at": ms(30).isoformat(),
        "runs": [{"run_id": f"asset_triggered__r{r}", "queued_at": ms(0).isoformat()} for r in rids],
    }


def verdict(
    runs: list[dict[str, Any]], groups: list[list[int]], tis: list[dict[str, Any]], log: list[dict[str, Any]]
) -> dict[str, Any]:
    return judge(
        events=3,
        producer_runs=3,
        groups=[{"ids": g} for g in groups],
        near_misses=0,
        runs={r["id"]: r for r in runs},
        tis=tis,
        history=set(),
        log=log,
        spec=RunSpec(mode="fail"),
    )


def test_a_stopped_duplicate_counts_as_caught_with_its_latency() -> None:
    """Group (1, 2): 1 ran, 2 was failed by dupguard 120 ms after creation with its task skipped."""
    runs = [run(1, "a"), run(2, "a", state="failed", note=SIDECAR_NOTE + " ...", end=120)]
    tis = [ti(1, "a", "success", 100), ti(2, "a", "skipped", 120, 120)]
    r = verdict(runs, [[1, 2]], tis, [detected("a", 1, 2, kept=1)])
    assert (r["recall"], r["false_positives"], r["remediations_of_kept_runs"]) == (1.0, 0, 0)
    assert (r["stopped_before_start"], r["catch_rate"]) == (1, 1.0)
    assert r["latency_ms"]["p50"] == 120.0
    assert r["deadline_ms"]["p50"] == 100.0


def test_the_guard_prevents_and_a_started_duplicate_is_caught_late() -> None:
    """Group (1, 2) prevented by the guard; group (3, 4) detected but 4's task ran (too late)."""
    runs = [run(1, "a"), run(2, "a", note=GUARD_NOTE + " ..."), run(3, "b"), run(4, "b")]
    tis = [ti(1, "a", "success", 50), ti(2, "a", "skipped", None), ti(3, "b", "success", 60), ti(4, "b", "success", 70)]
    log = [detected("a", 1, 2, kept=1), detected("b", 3, 4, kept=3)]
    r = verdict(runs, [[1, 2], [3, 4]], tis, log)
    assert (r["prevented_by_guard"], r["detected_but_ran"], r["missed"]) == (1, 1, 0)
    assert r["catch_rate"] == 0.5


def test_an_undetected_group_is_missed_and_fails_recall() -> None:
    """Nothing logged for group (1, 2): recall 0, the duplicate is missed."""
    r = verdict([run(1, "a"), run(2, "a")], [[1, 2]], [ti(1, "a", "success", 5), ti(2, "a", "success", 6)], [])
    assert (r["recall"], r["missed"], r["undetected_groups"]) == (
        0.0,
        1,
        [["asset_triggered__r1", "asset_triggered__r2"]],
    )


def test_false_positives_and_touched_kept_runs_are_counted() -> None:
    """A logged group of two unrelated runs is a false positive; stopping a run outside every group,
    stopping dupguard's own kept run, and stopping every run of a group are kept-run violations."""
    note = SIDECAR_NOTE + " ..."
    runs = [
        run(1, "a", note=note, state="failed", end=50),  # kept by dupguard's own log, yet stopped
        run(2, "a", note=note, state="failed", end=60),
        run(5, "c", note=note, state="failed", end=70),  # in no group
        run(6, "d"),
        run(7, "d"),
    ]
    log = [detected("a", 1, 2, kept=1), detected("d", 6, 7, kept=6)]
    r = verdict(runs, [[1, 2]], [], log)
    assert r["false_positives"] == 1  # (6, 7) is not a ground-truth group
    whys = sorted(v["why"] for v in r["kept_run_violations"])
    assert whys == ["dupguard's own kept run", "every run of its group stopped", "not in any duplicate group"]


def test_percentiles_use_nearest_rank() -> None:
    """p50 of 1..10 is 5, p99 is 10; an empty list has no figures."""
    p = percentiles([float(x) for x in range(1, 11)])
    assert (p["n"], p["p50"], p["p99"], p["max"]) == (10, 5.0, 10.0, 10.0)
    assert percentiles([])["p50"] is None


def test_a_remediation_that_airflow_overwrote_is_counted() -> None:
    """dupguard's skip of run 2 committed at 50 ms, yet its task started at 200 ms (the scheduler set
    it back to scheduled): detected but ran, and counted as remediated_then_ran."""
    runs = [run(1, "a"), run(2, "a", note=SIDECAR_NOTE + " ...", end=50)]
    runs[1]["end_date"] = ms(900)  # the run itself finished normally
    tis = [ti(1, "a", "success", 100), ti(2, "a", "success", 200, 300)]
    r = verdict(runs, [[1, 2]], tis, [detected("a", 1, 2, kept=1)])
    assert (r["detected_but_ran"], r["remediated_then_ran"], r["remediated_after_start"]) == (1, 1, 0)
    assert r["remediations_of_kept_runs"] == 0


def key_row(
    rid: int, dag: str, run_after: float, events: list[int], partition_key: str | None = None
) -> dict[str, Any]:
    return {"id": rid, "dag_id": dag, "run_after": ms(run_after), "partition_key": partition_key, "events": events}


def test_groups_are_runs_of_one_dag_that_consumed_one_event_more_than_once() -> None:
    """One run per event per consumer DAG is what Airflow promises: an event consumed by two runs of
    one DAG makes them a group whatever their run_after (the overlap race) or the rest of their
    events. Fan-out to other DAGs, a near miss with other events, and runs without events are not."""
    rows = [
        key_row(1, "a", 0, [10, 11]),
        key_row(2, "a", 0, [11, 10]),  # same set, other order
        key_row(3, "a", 0, [12]),  # same run_after, different events: each event still once
        key_row(4, "b", 0, [10, 11]),  # another DAG
        key_row(5, "o", 180, [20, 21]),  # the overlap race: a's run (t2, both events) ...
        key_row(6, "o", 0, [20]),  # ... and b's run (t1 < t2) consuming event 20 again
        key_row(7, "c", 0, []),
        key_row(8, "c", 0, []),  # no consumed events
        key_row(9, "s", 0, [30]),
        key_row(10, "s", 5, [31]),  # successive runs: disjoint events
    ]
    groups = duplicate_groups(rows)
    assert [(g["dag_id"], g["ids"], g["events"]) for g in groups] == [("a", [1, 2], [10, 11]), ("o", [5, 6], [20])]
    assert [g["overlap"] for g in groups] == [False, True]  # the overlap race: different run_after


def test_runs_linked_through_another_shared_event_are_one_group() -> None:
    """Chains: 1 and 2 share event 1, 2 and 3 share event 3: one group of three."""
    rows = [key_row(1, "a", 0, [1, 2]), key_row(2, "a", 5, [1, 3]), key_row(3, "a", 9, [3])]
    assert [g["ids"] for g in duplicate_groups(rows)] == [[1, 2, 3]]


def test_partitioned_runs_group_by_partition_key_and_shared_events() -> None:
    """Partitioned runs (partition_key set): one event may map to several keys (one run each), so an
    event counts once per (DAG, key); two runs of one key with one event are a group, whatever
    their run_after; a key re-processed with new events is not."""
    rows = [
        key_row(1, "p", 0, [20], "k1"),
        key_row(2, "p", 7, [20], "k1"),  # the duplicate: same key and events, later run_after
        key_row(3, "p", 9, [21], "k2"),
        key_row(4, "p", 9, [22], "k2"),  # same key, different events (a re-processed partition)
        key_row(5, "p", 12, [20], "k3"),  # event 20 mapped to another key as well
        key_row(6, "q", 0, [20], "k1"),  # another DAG
    ]
    groups = duplicate_groups(rows)
    assert [g["ids"] for g in groups] == [[1, 2]]
    assert groups[0]["partition_key"] == "k1"
    # a partitioned run never groups with a non-partitioned one of the same run_after and events
    assert duplicate_groups([key_row(1, "p", 0, [20], "k1"), key_row(2, "p", 0, [20])]) == []


def test_stopping_the_run_that_held_every_event_loses_an_event() -> None:
    """Overlap group: run 5 consumed events 20 and 21, run 6 only 20. Stopping 6 loses nothing;
    stopping 5 (keeping 6) leaves event 21 with no run although one run of the group survived:
    counted as a kept-run violation, which the e2e test asserts is 0."""
    rows = [key_row(5, "o", 180, [20, 21]), key_row(6, "o", 0, [20])]
    groups = [{"ids": g["ids"]} for g in duplicate_groups(rows)]
    note = SIDECAR_NOTE + " ..."

    def judged(stopped: int) -> dict[str, Any]:
        runs = [run(5, "o"), run(6, "o")]
        runs[[5, 6].index(stopped)].update(note=note, state="failed")
        log = [detected("o", 5, 6, kept=5 if stopped == 6 else 6)]
        return judge(3, 3, groups, 0, {r["id"]: r for r in runs}, [], set(), log, RunSpec(mode="fail"), rows)

    right, wrong = judged(stopped=6), judged(stopped=5)
    assert (right["events_lost_by_stopping"], right["remediations_of_kept_runs"]) == (0, 0)
    assert right["events_consumed_more_than_once"] == 1 and right["event_consumers"] == 2
    assert wrong["events_lost_by_stopping"] == 1
    assert [v["why"] for v in wrong["kept_run_violations"]] == ["every run of o that consumed event 21 stopped"]


def test_a_task_airflow_failed_before_it_started_did_not_run() -> None:
    """Run 2's task is ``failed`` with no start_date: the executor reported a failure before the
    task's ti_run (its worker could not reach the Execution API during an API outage) and the
    scheduler marked it failed. No task of the duplicate ran and dupguard did not stop it: neither
    detected but ran nor a catch, and the deadline ignores it."""
    runs = [run(1, "a"), run(2, "a", state="failed")]
    tis = [ti(1, "a", "success", 100), ti(2, "a", "failed", None, 9000)]
    r = verdict(runs, [[1, 2]], tis, [detected("a", 1, 2, kept=1)])
    assert (r["detected_but_ran"], r["stopped_before_start"], r["not_started_not_stopped"]) == (0, 0, 1)
    assert r["failed_by_airflow_before_start"] == 1
    assert r["catch_rate"] == 0.0
    assert r["deadline_ms"]["n"] == 1


def _dup(name: str, queued: float, started: float | None, category: str) -> dict[str, Any]:
    return {
        "dag_id": "a",
        "run_id": name,
        "queued_at": ms(queued),
        "first_task_start": ms(started) if started is not None else None,
        "category": category,
    }


def test_the_outage_judge_wants_every_duplicate_waiting_at_the_api_return_stopped() -> None:
    """API down at 1 s, answering again at 30 s. d1 ran before the outage (not waiting); d2 was
    created during it and stopped; d3 created during it, its task started after the return: a miss
    of the outage promise; d4 was failed by Airflow without running; d5 came after the return; d6's
    task has a start_date inside the outage (the worker's first ti_run attempt, accepted only once
    the API answered): it had not started at the return either, and ran: a miss too."""
    dups = [
        _dup("d1", 0, 500, "detected_but_ran"),
        _dup("d2", 2000, None, "stopped_before_start"),
        _dup("d3", 3000, 31000, "detected_but_ran"),
        _dup("d4", 4000, None, "not_started_not_stopped"),
        _dup("d5", 40000, None, "stopped_before_start"),
        _dup("d6", 5000, 9000, "detected_but_ran"),
    ]
    faults = [
        {"what": "api_down", "at": ms(1000).isoformat()},
        {"what": "api_ready", "at": ms(30000).isoformat()},
    ]
    out = judge_faults({"duplicates": dups}, faults, [])["outage"]
    assert (out["duplicates_created_during"], out["not_started_at_return"]) == (4, 4)
    assert (out["stopped_before_start"], out["not_run_not_stopped"]) == (1, 1)
    assert [d["run_id"] for d in out["ran"]] == ["d3", "d6"]
    assert out["unavailable_s"] == 29.0


def test_each_leader_kill_is_timed_to_the_next_leader_acquired() -> None:
    """Kills at 0 s and 10 s; replicas logged leader_acquired at -5 s (start), 0.9 s and 11.2 s;
    a third kill at 20 s was never followed by a takeover."""
    log = [{"event": "leader_acquired", "timestamp": ms(t).isoformat()} for t in (-5000, 900, 11200)]
    faults = [{"what": "leader_killed", "at": ms(t).isoformat()} for t in (0, 10000, 20000)]
    out = judge_faults({"duplicates": []}, faults, log)
    assert (out["leader_kills"], out["kills_without_takeover"]) == (3, 1)
    assert (out["takeover_ms"]["min"], out["takeover_ms"]["max"]) == (900.0, 1200.0)
    assert "outage" not in out


def test_a_killed_api_source_replica_takes_over_when_its_restart_watches_again() -> None:
    """The REST API source has no leader lock: its one replica is back when it logs ``watching``
    again (2.5 s after the kill). The database source's ``watching`` is not a takeover (its standby
    logs ``leader_acquired`` first): the second kill had none."""
    log = [
        {"event": "watching", "source": "api", "timestamp": ms(2500).isoformat()},
        {"event": "watching", "timestamp": ms(11000).isoformat()},
    ]
    faults = [{"what": "leader_killed", "at": ms(t).isoformat()} for t in (0, 10000)]
    out = judge_faults({"duplicates": []}, faults, log)
    assert (out["leader_kills"], out["kills_without_takeover"]) == (2, 1)
    assert out["takeover_ms"]["max"] == 2500.0


def test_a_clean_stop_logged_for_a_run_whose_task_had_started_is_flagged() -> None:
    """dupguard logged ``done`` for run 2, yet its task started at 20 ms (before the 120 ms stop):
    a mid-run stop reported as clean; run 4's ``done`` is honest (its task never started)."""
    note = SIDECAR_NOTE + " ..."
    runs = [run(1, "a"), run(2, "a", state="failed", note=note, end=120), run(3, "b"), run(4, "b", note=note)]
    tis = [ti(1, "a", "success", 10), ti(2, "a", "failed", 20, 120)]
    tis += [ti(3, "b", "success", 10), ti(4, "b", "skipped", None)]

    def outcome(dag: str, rid: int) -> dict[str, Any]:
        done = {"run_id": f"asset_triggered__r{rid}", "result": "done", "committed_at": ms(120).isoformat()}
        return {"event": "remediation_outcome", "dag_id": dag, "results": [done]}

    log = [detected("a", 1, 2, kept=1), detected("b", 3, 4, kept=3), outcome("a", 2), outcome("b", 4)]
    r = verdict(runs, [[1, 2], [3, 4]], tis, log)
    assert r["done_but_started"] == ["asset_triggered__r2"]


def test_a_trigger_event_group_and_its_stop_are_left_to_the_sqs_judge() -> None:
    """Runs 3 and 4 consumed different copies of one message (no shared event, so no asset group):
    dupguard logged a trigger_event group and stopped 4. The asset judge neither counts the group as a
    false positive nor the stop as one outside every group (tests/e2e/family_sqs.py judges both)."""
    note = SIDECAR_NOTE + " ..."
    runs = [run(1, "a"), run(2, "a"), run(3, "q"), run(4, "q", note=note, state="failed", end=80)]
    line = detected("q", 3, 4, kept=3) | {"kind": "trigger_event", "group_key": "trigger_event|q|x"}
    stop = {
        "event": "remediation_outcome",
        "dag_id": "q",
        "group_key": "trigger_event|q|x",
        "results": [{"run_id": "asset_triggered__r4", "result": "done", "committed_at": ms(80).isoformat()}],
    }
    r = verdict(runs, [[1, 2]], [], [detected("a", 1, 2, kept=1), line, stop])
    assert (r["false_positives"], r["recall"]) == (0, 1.0)
    assert r["kept_run_violations"] == []

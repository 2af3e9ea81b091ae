"""The trigger_flapping rule (detector.checks.trigger_flapping.rule) on what Airflow's own code wrote.

The fixtures' ``samples`` are the trigger and triggerer-job rows after each triggerer loop
(scripts/airflow/scenarios_triggers.py); their truth is which owner changes happened while Airflow's
own alive query held the previous owner alive (``expected_flapping``), never this rule.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from detector.checks.trigger_flapping.rule import (
    ASSET,
    CALLBACK,
    UNPROTECTED,
    Owner,
    TriggererJob,
    TriggerRow,
    exposure,
    judge_owners,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "scenarios"
CASES = sorted((p.parent.parent.name, p.stem) for p in FIXTURES.glob("*/triggers/*.json"))
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
THRESHOLD = timedelta(seconds=30)


def _ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _truth(version: str, scenario: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / version / "triggers" / f"{scenario}.json").read_text())
    return data


def sample_rows(truth: dict[str, Any], sample: dict[str, Any]) -> tuple[list[TriggerRow], list[TriggererJob]]:
    """One sample as the rule's input rows (what the queries read from that sample's dump)."""
    kind = CALLBACK if truth["scenario"] == "flip_callback" else ASSET
    triggers = [
        TriggerRow(
            id=t["id"],
            created_date=datetime.fromisoformat(t["created_date"]),
            triggerer_id=t["triggerer_id"],
            kind=kind,
            assets=() if kind == CALLBACK else ("orders",),
            dag_ids=tuple(truth["consumer_dag_ids"]) or ("late_report",),
        )
        for t in sample["triggers"]
    ]
    jobs = [
        TriggererJob(
            id=j["id"],
            hostname=j["hostname"],
            state=j["state"],
            start_date=_ts(j["start_date"]),
            end_date=_ts(j["end_date"]),
            latest_heartbeat=_ts(j["latest_heartbeat"]),
        )
        for j in sample["triggerer_jobs"]
    ]
    return triggers, jobs


def replay(truth: dict[str, Any], indexes: list[int]) -> list[tuple[int, int, int, int]]:
    """(trigger id, from job, to job, sample) of every flap the rule finds over the chosen samples."""
    threshold = timedelta(seconds=truth["health_check_threshold_seconds"])
    memory: dict[tuple[int, datetime], Owner] = {}
    found = []
    for i in indexes:
        sample = truth["samples"][i]
        triggers, jobs = sample_rows(truth, sample)
        flaps, memory = judge_owners(triggers, jobs, memory, datetime.fromisoformat(sample["db_now"]), threshold)
        found += [(f.trigger.id, f.previous.id, f.trigger.triggerer_id or 0, i) for f in flaps]
    return found


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_every_look_finds_exactly_the_flapping_airflow_did(version: str, scenario: str) -> None:
    """Looking after every loop: the owner changes Airflow made while the old owner was alive, nothing else."""
    truth = _truth(version, scenario)
    expected = [(f["trigger_id"], f["from_job"], f["to_job"], f["sample"]) for f in truth["expected_flapping"]]
    assert replay(truth, list(range(len(truth["samples"])))) == expected


def test_the_fixtures_cover_the_affected_and_the_fixed_releases() -> None:
    """3.0.6 and 3.1.2 flip an asset trigger, 3.2.2 keeps it; callback triggers flip on 3.1.2-3.3.2."""
    flips = {(v, s): bool(_truth(v, s)["expected_flapping"]) for v, s in CASES}
    assert flips[("3.0.6", "flip_asset")] and flips[("3.1.2", "flip_asset")]
    assert not flips[("3.2.2", "flip_asset")] and not flips[("3.3.2", "flip_asset")]
    assert all(flips[(v, "flip_callback")] for v in ("3.1.2", "3.2.2", "3.3.2"))
    assert not any(flips[("3.1.2", s)] for s in ("stale_owner", "ended_owner", "recreated"))
    assert all(_truth("3.1.2", s)["owner_changes"] for s in ("stale_owner", "ended_owner"))  # a real takeover


def test_a_stale_gap_between_two_looks_is_not_flapping_even_if_the_owner_is_fresh_again() -> None:
    """stale_owner seen only before and after the takeover: a's heartbeat is fresh at the second look,
    but its heartbeats at the two looks are further apart than the threshold, so it may have been stale."""
    truth = _truth("3.1.2", "stale_owner")
    last = truth["samples"][-1]
    a = next(j for j in last["triggerer_jobs"] if j["hostname"] == "triggerer-a")
    db_now = datetime.fromisoformat(last["db_now"])
    assert db_now - datetime.fromisoformat(a["latest_heartbeat"]) < timedelta(seconds=3)  # fresh again
    assert replay(truth, [0, len(truth["samples"]) - 1]) == []


def _job(
    job_id: int, heartbeat: datetime | None, *, state: str = "running", end: datetime | None = None
) -> TriggererJob:
    return TriggererJob(job_id, f"triggerer-{job_id}", state, T0 - timedelta(hours=1), end, heartbeat)


def _trigger(owner: int | None, *, trigger_id: int = 7, created: datetime = T0 - timedelta(days=1)) -> TriggerRow:
    return TriggerRow(trigger_id, created, owner, ASSET, ("orders",), ("orders_consumer",))


def _look(owner: int, jobs: list[TriggererJob], memory: dict[Any, Owner], at: datetime) -> tuple[list[Any], Any]:
    return judge_owners([_trigger(owner)], jobs, memory, at, THRESHOLD)


def test_an_owner_change_while_the_old_owner_heartbeats_is_flapping() -> None:
    first, memory = _look(1, [_job(1, T0 - timedelta(seconds=2)), _job(2, T0)], {}, T0)
    assert first == []  # a first look has nothing to compare
    later = T0 + timedelta(seconds=10)
    [flap], _ = _look(2, [_job(1, later - timedelta(seconds=3)), _job(2, later)], memory, later)
    assert (flap.previous.id, flap.current and flap.current.id, flap.previous_seen_at) == (1, 2, T0)


@pytest.mark.parametrize(
    "old_owner_now",
    [
        pytest.param(_job(1, T0 - timedelta(seconds=25)), id="stale-now"),
        pytest.param(_job(1, T0 + timedelta(seconds=9), state="success", end=T0 + timedelta(seconds=9)), id="ended"),
        pytest.param(_job(1, T0 + timedelta(seconds=9), state="running", end=T0 + timedelta(seconds=9)), id="end-date"),
        pytest.param(_job(1, T0 + timedelta(seconds=40)), id="gap-longer-than-threshold"),
        pytest.param(_job(1, T0 + timedelta(seconds=9), state="failed"), id="state-not-running"),
    ],
)
def test_a_takeover_from_a_dead_ended_or_silent_triggerer_is_not_flapping(old_owner_now: TriggererJob) -> None:
    _, memory = _look(1, [_job(1, T0 - timedelta(seconds=2))], {}, T0)
    later = max(T0 + timedelta(seconds=10), (old_owner_now.latest_heartbeat or T0) + timedelta(seconds=1))
    flaps, _ = _look(2, [old_owner_now, _job(2, later)], memory, later)
    assert flaps == []


def test_a_previous_owner_already_stale_at_the_first_look_is_not_flapping() -> None:
    """Stale at the first look (31 s), fresh at the second, heartbeats 19 s apart: it was not alive."""
    _, memory = _look(1, [_job(1, T0 - timedelta(seconds=31))], {}, T0)
    later = T0 + timedelta(seconds=5)
    assert _look(2, [_job(1, T0 - timedelta(seconds=12)), _job(2, later)], memory, later)[0] == []


def test_a_recreated_trigger_with_the_same_id_is_another_trigger() -> None:
    """SQLite can hand a deleted id out again: the created_date tells the two triggers apart."""
    jobs = [_job(1, T0), _job(2, T0)]
    _, memory = judge_owners([_trigger(1)], jobs, {}, T0, THRESHOLD)
    again = _trigger(2, created=T0 + timedelta(seconds=1))
    later = T0 + timedelta(seconds=5)
    flaps, memory = judge_owners([again], [_job(1, later), _job(2, later)], memory, later, THRESHOLD)
    assert flaps == [] and list(memory) == [again.identity]


def test_a_deleted_trigger_is_forgotten_and_an_unassigned_one_is_not_remembered() -> None:
    _, memory = judge_owners([_trigger(1), _trigger(None, trigger_id=8)], [_job(1, T0)], {}, T0, THRESHOLD)
    assert list(memory) == [_trigger(1).identity]
    _, memory = judge_owners([], [_job(1, T0)], memory, T0, THRESHOLD)
    assert memory == {}


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _span(job_id: int, start: int, end: int | None, heartbeat: int) -> TriggererJob:
    return TriggererJob(
        job_id,
        f"t{job_id}",
        "running" if end is None else "success",
        _at(start),
        _at(end) if end is not None else None,
        _at(heartbeat),
    )


def test_exposure_needs_two_triggerers_alive_at_once_while_the_trigger_existed() -> None:
    trigger = _trigger(1, created=T0)
    overlapping = [_span(1, 0, None, 60), _span(2, 30, 45, 45)]
    [found] = exposure([trigger], overlapping, UNPROTECTED["3.1"])
    assert [j.id for j in found.jobs] == [1, 2] and found.certain_version
    assert (found.overlap_start, found.overlap_end) == (T0 + timedelta(minutes=30), T0 + timedelta(minutes=45))
    one_after_the_other = [_span(1, 0, 30, 30), _span(2, 30, None, 60)]
    assert exposure([trigger], one_after_the_other, UNPROTECTED["3.1"]) == []
    before_the_trigger = [_span(1, -60, -10, -10), _span(2, -50, -20, -20), _span(3, 0, None, 60)]
    assert exposure([trigger], before_the_trigger, UNPROTECTED["3.1"]) == []
    assert exposure([trigger], overlapping, UNPROTECTED["3.1"], since=T0 + timedelta(minutes=50)) == []


def test_exposure_only_for_the_kinds_a_release_leaves_unfiltered() -> None:
    jobs = [_span(1, 0, None, 60), _span(2, 0, None, 60)]
    asset, callback = _trigger(1, created=T0), TriggerRow(9, T0, 1, CALLBACK, (), ("late_report",))
    assert [e.trigger.kind for e in exposure([asset, callback], jobs, UNPROTECTED["3.0"])] == [ASSET]
    assert [e.trigger.kind for e in exposure([asset, callback], jobs, UNPROTECTED["3.3"])] == [CALLBACK]
    [uncertain, certain] = exposure([asset, callback], jobs, UNPROTECTED["3.2"])
    assert (uncertain.trigger.kind, uncertain.certain_version, certain.certain_version) == (ASSET, False, True)

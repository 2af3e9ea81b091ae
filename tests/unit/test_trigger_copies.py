"""Copies of one message without an id (checks.trigger_flapping.rule_copies): suspected only for a broadcast payload
(a Redis pub/sub message, which every copy of the trigger receives), two triggerers alive at each
event, within the window, and an extra run; every look-alike the issue and the end-to-end run name
is left alone."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from detector.checks.trigger_flapping.rule import TriggererJob, alive_at
from detector.checks.trigger_flapping.rule_copies import extra_runs, suspected_copies
from detector.core.trigger_event import Copies, TriggerEvent, broadcast, trigger_event
from tests.factories import T0, run

WINDOW = timedelta(seconds=60)
THRESHOLD = timedelta(seconds=30)
REDIS = {"type": "message", "pattern": None, "channel": "orders", "data": '{"order": 42}'}


def event(event_id: int, seconds: float, payload: Any = REDIS, asset_id: int = 1) -> TriggerEvent:
    made = trigger_event(
        event_id, asset_id, T0 + timedelta(seconds=seconds), {"from_trigger": True, "payload": payload}, None
    )
    assert made is not None
    return made


def always(_: datetime) -> bool:
    return True


def never(_: datetime) -> bool:
    return False


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (REDIS, True),  # redis AwaitMessageTrigger: the pub/sub message
        ({**REDIS, "type": "subscribe"}, False),  # not a message (the trigger yields only type "message")
        ({"channel": "orders", "data": "x"}, False),  # not the pub/sub shape
        (True, False),  # FileDeleteTrigger: the copies compete for the file
        ({"filepath": "/data/x"}, False),
        ('{"order": 42}', False),  # Kafka: a group's copies split the partitions
        ({"message": "x", "queue": "orders"}, False),  # Service Bus: a locked message goes to one copy
        (None, False),
    ],
)
def test_broadcast_is_the_redis_pub_sub_message_only(payload: object, expected: bool) -> None:
    assert broadcast(payload) is expected


def test_one_redis_message_in_two_runs_is_one_suspected_set() -> None:
    """The Airflow-made trigger_event_no_id: each copy's event made its own run."""
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    [found] = suspected_copies(
        [event(1, 0), event(2, 0.8)], WINDOW, {10: frozenset({1}), 11: frozenset({2})}, [a, b], always
    )
    assert (found.dag_id, found.asset_id, found.event_ids, [r.id for r in found.runs]) == (
        "consumer",
        1,
        (1, 2),
        [10, 11],
    )
    assert (found.first, found.last) == (T0, T0 + timedelta(milliseconds=800))
    assert (found.first_run.id, [r.id for r in found.extra_runs]) == (10, [11])


def test_a_copy_absorbed_by_a_run_with_a_new_message_made_no_extra_run() -> None:
    """The Airflow-made trigger_event_no_id_absorbed: the second run consumed b's copy of M1 and M2, a
    different message (here of another asset): it was needed for M2, so nothing is reported."""
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    events = [event(1, 0), event(2, 0.8), event(3, 0.9, payload={**REDIS, "channel": "customers"}, asset_id=2)]
    assert suspected_copies(events, WINDOW, {10: frozenset({1}), 11: frozenset({2, 3})}, [a, b], always) == []


def test_a_task_event_beside_the_copy_also_makes_the_run_needed() -> None:
    """An event that is no trigger's (a task's, the REST API's) is in no copy set: the run was needed."""
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    consumed = {10: frozenset({1}), 11: frozenset({2, 99})}
    assert suspected_copies([event(1, 0), event(2, 0.8)], WINDOW, consumed, [a, b], always) == []


def test_only_the_runs_made_of_copies_alone_are_named_extra() -> None:
    """Three copies: the second run also took a new message (not extra), the third only a copy (extra);
    the finding names the first run apart."""
    a, b, c = (run(id=i, run_after=T0 + timedelta(seconds=i - 10)) for i in (10, 11, 12))
    events = [event(1, 0), event(2, 0.5), event(3, 1.0), event(4, 0.6, payload={**REDIS, "data": "other"})]
    consumed = {10: frozenset({1}), 11: frozenset({2, 4}), 12: frozenset({3})}
    [found] = suspected_copies(events, WINDOW, consumed, [c, b, a], always)
    assert ([r.id for r in found.runs], found.first_run.id, [r.id for r in found.extra_runs]) == (
        [10, 11, 12],
        10,
        [12],
    )


def _chains(*sets: set[int]) -> list[Copies]:
    return [Copies(frozenset(s), False) for s in sets]


@pytest.mark.parametrize(
    ("case", "consumed", "chains", "extra"),
    [
        ("every event a copy of an earlier run's", {10: {1}, 11: {2}}, [{1, 2}], {11}),
        ("the first consumer is never extra", {10: {1}}, [{1, 2}], set()),
        ("one event outside every set", {10: {1}, 11: {2, 5}}, [{1, 2}], set()),
        ("the very same event: an overlap, not a copy", {10: {1}, 11: {1}}, [{1, 2}], set()),
        ("copies of two messages, both consumed before", {10: {1, 3}, 11: {2, 4}}, [{1, 2}, {3, 4}], {11}),
        ("copies of two messages, one new", {10: {1}, 11: {2, 4}}, [{1, 2}, {3, 4}], set()),
        ("earlier means a lower id, not the order given", {11: {1}, 10: {2}}, [{1, 2}], {11}),
        ("a run of no events is not extra", {10: {1}, 11: set()}, [{1, 2}], set()),
        ("another DAG's run is no earlier run", {10: {1}, 12: {2}}, [{1, 2}], set()),
    ],
)
def test_extra_runs_boundaries(case: str, consumed: dict[int, set[int]], chains: list[Copies], extra: set[int]) -> None:
    runs = [run(id=i, dag_id="other" if i == 12 else "consumer") for i in consumed]
    found = extra_runs(runs, {k: frozenset(v) for k, v in consumed.items()}, _chains(*map(set, chains)))
    assert found == extra, case


def test_a_file_watchers_equal_payloads_are_left_alone() -> None:
    """The end-to-end run: FileDeleteTrigger's payload is `true` for every file, one event per file."""
    runs = [run(id=10 + i, run_after=T0 + timedelta(seconds=2 * i)) for i in range(5)]
    events = [event(i, 2.0 * i, payload=True) for i in range(5)]
    consumed = {10 + i: frozenset({i}) for i in range(5)}
    assert suspected_copies(events, WINDOW, consumed, runs, always) == []


@pytest.mark.parametrize(
    ("case", "events", "consumed", "two_alive"),
    [
        ("one run consumed both copies", [event(1, 0), event(2, 0.5)], {10: frozenset({1, 2})}, always),
        ("the second copy made no run", [event(1, 0), event(2, 0.5)], {10: frozenset({1})}, always),
        ("one triggerer alive", [event(1, 0), event(2, 0.8)], {10: frozenset({1}), 11: frozenset({2})}, never),
        (
            "farther apart than the window",
            [event(1, 0), event(2, 61)],
            {10: frozenset({1}), 11: frozenset({2})},
            always,
        ),
        (
            "different bodies",
            [event(1, 0), event(2, 0.8, {**REDIS, "data": "other"})],
            {10: frozenset({1}), 11: frozenset({2})},
            always,
        ),
        (
            "two assets",
            [event(1, 0), event(2, 0.8, asset_id=2)],
            {10: frozenset({1}), 11: frozenset({2})},
            always,
        ),
        (
            "a message id decides (trigger_event's own rule)",
            [
                event(1, 0, {"message_batch": [{"MessageId": "m"}]}),
                event(2, 0.8, {"message_batch": [{"MessageId": "m"}]}),
            ],
            {10: frozenset({1}), 11: frozenset({2})},
            always,
        ),
    ],
)
def test_look_alikes_are_left_alone(
    case: str, events: list[TriggerEvent], consumed: dict[int, frozenset[int]], two_alive: Any
) -> None:
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    assert suspected_copies(events, WINDOW, consumed, [a, b], two_alive) == [], case


def test_only_asset_runs_of_one_dag_count() -> None:
    """A manual run, a partitioned run or another DAG's run is not the consumer's extra run."""
    a = run(id=10)
    for other in (run(id=11, run_type="manual"), run(id=11, partition_key="p"), run("other", id=11)):
        found = suspected_copies(
            [event(1, 0), event(2, 0.8)], WINDOW, {10: frozenset({1}), 11: frozenset({2})}, [a, other], always
        )
        assert found == [], other


def test_every_event_of_the_set_needs_two_triggerers_alive() -> None:
    a, b = run(id=10), run(id=11)
    seen: list[datetime] = []

    def first_only(at: datetime) -> bool:
        seen.append(at)
        return at == T0

    found = suspected_copies(
        [event(1, 0), event(2, 0.8)], WINDOW, {10: frozenset({1}), 11: frozenset({2})}, [a, b], first_only
    )
    assert found == [] and seen == [T0, T0 + timedelta(milliseconds=800)]


def at(seconds: float | None) -> datetime | None:
    return None if seconds is None else T0 + timedelta(seconds=seconds)


def job(id: int, start: float, beat: float | None, end: float | None = None) -> TriggererJob:
    return TriggererJob(id, f"t{id}", "running" if end is None else "success", at(start), at(end), at(beat))


def test_alive_at_counts_jobs_by_their_own_timestamps() -> None:
    """Started before, and ended after or still running with the heartbeat under the threshold then."""
    jobs = [job(1, 0, 5), job(2, 0, 5, end=10), job(3, 20, 25), job(4, 0, None)]
    assert alive_at(jobs, T0 + timedelta(seconds=8), THRESHOLD) == 2  # 1 (5 + 30 s), 2 (ended at 10)
    assert alive_at(jobs, T0 + timedelta(seconds=21), THRESHOLD) == 2  # 1 and 3
    assert alive_at(jobs, T0 + timedelta(seconds=35), THRESHOLD) == 1  # 1's beat is 30 s old: 3 only
    assert alive_at(jobs, T0 - timedelta(seconds=1), THRESHOLD) == 0  # before any started

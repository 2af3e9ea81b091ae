"""The trigger_event kind's pure parts: which events a trigger wrote, the message ids in their
payloads (docs/explanation/airflow-internals.md, "One message, one asset event per triggerer"), copies of one message,
and the groups of runs they make."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from detector.core.detect import find_duplicates
from detector.core.model import Confidence, Decisions, Kind, TaskProgress
from detector.core.trigger_event import (
    Copies,
    copies,
    copies_possible,
    find_trigger_event_duplicates,
    from_trigger,
    message_ids,
    trigger_event,
)
from tests.factories import T0, run

WINDOW = timedelta(seconds=60)


def sqs(*ids: str, receipt: str = "r1") -> dict[str, Any]:
    """SqsSensorTrigger's payload (amazon aws/triggers/sqs.py L231): the messages as SQS returns them."""
    batch = [{"MessageId": i, "ReceiptHandle": receipt, "MD5OfBody": "b71e", "Body": '{"order": 42}'} for i in ids]
    return {"status": "success", "message_batch": batch}


def extra(payload: object) -> dict[str, Any]:
    return {"from_trigger": True, "payload": payload}


@pytest.mark.parametrize(
    ("payload", "ids"),
    [
        (sqs("m-1", "m-2"), {"sqs:m-1", "sqs:m-2"}),
        (
            {"status": "success", "message_batch": [{"ShardId": "s-0", "SequenceNumber": "495", "Data": "eA=="}]},
            {"kinesis:s-0/495"},
        ),
        (
            {"status": "success", "message": [{"ack_id": "a", "message": {"data": "eA==", "message_id": "p-7"}}]},
            {"pubsub:p-7"},
        ),
        ('{"order": 42}', set()),  # Kafka AwaitMessageTrigger without apply_function: the value
        ({"type": "message", "pattern": None, "channel": "orders", "data": "x"}, set()),  # Redis pub/sub
        ({"message": '{"order": 42}', "queue": "orders"}, set()),  # Azure Service Bus: the body only
        (True, set()),  # FileDeleteTrigger
        ({"filepath": "/data/x"}, set()),  # 3.3's DirectoryFileDeleteTrigger
        ({"status": "success"}, set()),  # DynamoDBValueSensorTrigger
        ({"message_batch": [{"MessageId": 7}, "junk", {"ShardId": "s"}]}, set()),  # not the providers' types
        ({"message": [{"message": {"message_id": ""}}]}, set()),
        (None, set()),
    ],
)
def test_message_ids_by_the_providers_shapes(payload: object, ids: set[str]) -> None:
    assert message_ids(payload) == ids


def test_only_airflows_trigger_extra_counts() -> None:
    """submit_event's extra with no source task; the REST API marks any extra it is given."""
    assert from_trigger(extra(sqs("m")), None)
    assert not from_trigger({**extra(sqs("m")), "from_rest_api": True}, None)  # a copied extra, posted
    assert not from_trigger(extra(sqs("m")), "producer")  # a task's outlet event
    assert not from_trigger({"from_trigger": "true", "payload": 1}, None)
    assert not from_trigger(None, None) and not from_trigger([1], None)
    assert trigger_event(1, 1, T0, {"from_rest_api": True}, None) is None


def ev(event_id: int, payload: object, *, seconds: float = 0, asset: int = 1) -> Any:
    made = trigger_event(event_id, asset, T0 + timedelta(seconds=seconds), extra(payload), None)
    assert made is not None
    return made


def test_copies_by_message_id_whatever_the_rest_of_the_payload() -> None:
    """A redelivered SQS message has a new ReceiptHandle and the same MessageId: one message."""
    [c] = copies([ev(1, sqs("m-1", receipt="r1")), ev(2, sqs("m-1", receipt="r2"), seconds=0.2)], WINDOW)
    assert c == Copies(frozenset({1, 2}), proven=True)


def test_equal_bodies_with_different_ids_are_two_messages() -> None:
    assert copies([ev(1, sqs("m-1")), ev(2, sqs("m-2"))], WINDOW) == []


def test_copies_need_one_asset_and_the_window() -> None:
    assert copies([ev(1, sqs("m-1")), ev(2, sqs("m-1"), asset=2)], WINDOW) == []
    assert copies([ev(1, sqs("m-1")), ev(2, sqs("m-1"), seconds=61)], WINDOW) == []
    # a chain: each within the window of the one before
    [c] = copies([ev(1, sqs("m")), ev(2, sqs("m"), seconds=50), ev(3, sqs("m"), seconds=100)], WINDOW)
    assert c.event_ids == {1, 2, 3}


def test_equal_payloads_without_an_id_are_unproven_copies() -> None:
    redis = {"type": "message", "pattern": None, "channel": "orders", "data": "x"}
    [c] = copies([ev(1, redis), ev(2, dict(redis))], WINDOW)
    assert c == Copies(frozenset({1, 2}), proven=False)
    assert copies([ev(1, redis), ev(2, {**redis, "data": "y"})], WINDOW) == []


PROVEN = [Copies(frozenset({5, 6}), proven=True)]


def test_two_runs_of_one_message_are_a_confirmed_group_kept_by_todays_rule() -> None:
    a, b = run(id=10, job=1), run(id=11, job=1, run_after=T0 + timedelta(seconds=1))
    events = {10: frozenset({5}), 11: frozenset({6})}
    assert find_duplicates([a, b], events) == []  # the asset rule does not link them
    [f] = find_trigger_event_duplicates([a, b], events, PROVEN)
    assert (f.kind, f.confidence) == (Kind.TRIGGER_EVENT, Confidence.CONFIRMED)
    assert f.kept == a and f.duplicates == (b,) and f.shared_event_ids == (5, 6)
    assert f.key == f"trigger_event|consumer|{T0.isoformat()}"
    [started] = find_trigger_event_duplicates([a, b], events, PROVEN, {11: TaskProgress(total=1, started=1)})
    assert started.kept == b
    [decided] = find_trigger_event_duplicates([a, b], events, PROVEN, prior=Decisions(kept=frozenset({11})))
    assert decided.kept == b


def test_unproven_copies_link_no_runs() -> None:
    """Equal payloads without an id: repeated real messages of a watcher look the same (the e2e run)."""
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    found = find_trigger_event_duplicates(
        [a, b], {10: frozenset({5}), 11: frozenset({6})}, [Copies(frozenset({5, 6}), False)]
    )
    assert found == []


def test_confirmed_only_when_the_kept_run_consumed_everything_the_others_did() -> None:
    a, b = run(id=10), run(id=11, run_after=T0 + timedelta(seconds=1))
    [covered] = find_trigger_event_duplicates([a, b], {10: frozenset({5}), 11: frozenset({6, 7})}, PROVEN)
    assert covered.confidence is Confidence.CONFIRMED and covered.kept == b  # b also processed event 7
    [partial] = find_trigger_event_duplicates([a, b], {10: frozenset({5, 8}), 11: frozenset({6, 7})}, PROVEN)
    assert partial.confidence is Confidence.SUSPECTED  # stopping either loses an event


def test_an_unproven_set_beside_a_proven_one_links_nothing() -> None:
    a, b, c = run(id=10), run(id=11), run(id=12)
    found = [Copies(frozenset({5, 6}), True), Copies(frozenset({7, 8}), False)]
    [f] = find_trigger_event_duplicates(
        [a, b, c], {10: frozenset({5}), 11: frozenset({6, 7}), 12: frozenset({8})}, found
    )
    assert f.kept.id == 11 and [r.id for r in f.duplicates] == [10]  # 12 is linked only by equal payloads
    assert f.confidence is Confidence.CONFIRMED


def test_no_group_without_two_runs_of_one_dag() -> None:
    a, b = run(id=10), run(id=11)
    assert find_trigger_event_duplicates([a], {10: frozenset({5, 6})}, PROVEN) == []  # both copies, one run
    fanout = [run("orders_consumer", id=10), run("orders_report", id=11)]
    assert find_trigger_event_duplicates(fanout, {10: frozenset({5}), 11: frozenset({6})}, PROVEN) == []
    assert find_trigger_event_duplicates([a, b], {10: frozenset({5}), 11: frozenset({9})}, PROVEN) == []
    manual = run(id=11, run_type="manual")
    assert find_trigger_event_duplicates([a, manual], {10: frozenset({5}), 11: frozenset({6})}, PROVEN) == []
    part = run(id=11, partition_key="2026-01-01")
    assert find_trigger_event_duplicates([a, part], {10: frozenset({5}), 11: frozenset({6})}, PROVEN) == []
    # 11 is the duplicate of another kind's group: judged there, not linked again here.
    [asset] = find_duplicates([run(id=9), b], {9: frozenset({6}), 11: frozenset({6})})
    assert (asset.kept.id, [r.id for r in asset.duplicates]) == (9, [11])
    beside = find_trigger_event_duplicates([a, b], {10: frozenset({5}), 11: frozenset({6})}, PROVEN, beside=[asset])
    assert beside == []


def test_doctor_counts_a_trigger_event_group_on_neither_scheduler_path() -> None:
    """doctor's exposure per code path (asset: the 3.0/3.1 queue race; partitioned: 3.2) must not take
    a group the triggerers made for a partitioned race."""
    from detector.app.doctor import Findings, _duplicates

    a, b = run(id=10), run(id=11)
    [f] = find_trigger_event_duplicates([a, b], {10: frozenset({5}), 11: frozenset({6})}, PROVEN)
    out = Findings()
    _duplicates([f], 0, {}, out)
    assert (out.seen["asset_groups_found"], out.seen["partitioned_groups_found"]) == (0, 0)


@pytest.mark.parametrize(
    ("version", "possible"),
    [("3.0.6", True), ("3.1.2", True), ("3.2.1", True), ("3.2", True), ("3.2.2", False), ("3.3.2", False), ("?", True)],
)
def test_copies_are_possible_before_the_owner_filter_of_3_2_2(version: str, possible: bool) -> None:
    """Asset triggers run on every triggerer before 3.2.2 (apache/airflow PR #65792); a version that
    cannot be read errs towards looking."""
    assert copies_possible(version) is possible

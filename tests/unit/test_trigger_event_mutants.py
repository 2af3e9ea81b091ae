"""The trigger_event rule's contract at the edges its first tests left open (each test here failed on
a mutant of ``detector/core/trigger_event.py`` that those tests let through: benchmarks/results/mutation.md).

Payloads are the shapes of the Airflow-made fixtures (tests/fixtures/scenarios/3.1.2/
trigger_event_two_runs.sql: SqsSensorTrigger's ``message_batch``; trigger_event_no_id.sql: a Redis
pub/sub message)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from detector.core.detect import DagFilter, linked_sets
from detector.core.model import Run
from detector.core.plan import note_for
from detector.core.trigger_event import (
    Copies,
    TriggerEvent,
    copies,
    find_trigger_event_duplicates,
    message_ids,
    trigger_event,
)
from tests.factories import T0, run

WINDOW = timedelta(seconds=60)
M1 = "5fea7756-0ea4-451a-a703-a558b933e274"  # the fixture's MessageId


def sqs(message_id: str, receipt: str) -> dict[str, Any]:
    """SqsSensorTrigger's payload as trigger_event_two_runs.sql holds it."""
    message = {"MessageId": message_id, "ReceiptHandle": receipt, "MD5OfBody": "b71e", "Body": '{"order": 42}'}
    return {"status": "success", "message_batch": [message]}


def made(event_id: int, extra: object, *, seconds: float = 0, source_dag_id: str | None = None) -> TriggerEvent:
    found = trigger_event(event_id, 1, T0 + timedelta(seconds=seconds), extra, source_dag_id)
    assert found is not None
    return found


def sqs_event(event_id: int, seconds: float) -> TriggerEvent:
    return made(event_id, {"from_trigger": True, "payload": sqs(M1, f"r{event_id}")}, seconds=seconds)


def test_a_malformed_entry_hides_no_later_message_id() -> None:
    """Every message id the payload carries counts, whatever sits before it in the list."""
    assert message_ids({"message_batch": ["junk", {"MessageId": M1}]}) == {f"sqs:{M1}"}
    assert message_ids({"message": ["junk", {"message": {"message_id": "p-7"}}]}) == {"pubsub:p-7"}


def test_a_tasks_event_with_a_triggers_extra_is_no_trigger_event() -> None:
    """Only Trigger.submit_event's events count: an outlet event of a task (source_dag_id set) is not one
    even when the task copied a trigger's extra."""
    extra = {"from_trigger": True, "payload": sqs(M1, "r1")}
    assert trigger_event(1, 1, T0, extra, "producer") is None


def test_a_trigger_extra_without_a_payload_is_an_event_without_an_id() -> None:
    found = made(1, {"from_trigger": True})
    assert found.message_ids == frozenset()
    [c] = copies([found, made(2, {"from_trigger": True})], WINDOW)
    assert c == Copies(frozenset({1, 2}), proven=False)


def test_equal_payloads_are_equal_in_any_key_order() -> None:
    """Equal payloads (dict equality) are one body, however the JSON that carried them ordered its keys."""
    redis = {"type": "message", "pattern": None, "channel": "orders", "data": "x"}
    reordered = dict(reversed(list(redis.items())))
    assert list(reordered) != list(redis) and reordered == redis
    [c] = copies(
        [made(1, {"from_trigger": True, "payload": redis}), made(2, {"from_trigger": True, "payload": reordered})],
        WINDOW,
    )
    assert c == Copies(frozenset({1, 2}), proven=False)


def test_copies_exactly_the_window_apart_are_one_message() -> None:
    """The window is inclusive, as the suspect window of the asset rule is (detect._clusters_within)."""
    [c] = copies([sqs_event(1, 0), sqs_event(2, WINDOW.total_seconds())], WINDOW)
    assert c == Copies(frozenset({1, 2}), proven=True)


def test_every_chain_of_one_message_id_is_proven() -> None:
    """A message redelivered after the window starts a second chain; the id proves both, not only the last."""
    found = copies([sqs_event(1, 0), sqs_event(2, 1), sqs_event(3, 200), sqs_event(4, 201)], WINDOW)
    assert sorted(found, key=lambda c: min(c.event_ids)) == [
        Copies(frozenset({1, 2}), proven=True),
        Copies(frozenset({3, 4}), proven=True),
    ]


PROVEN = [Copies(frozenset({5, 6}), proven=True)]
TWO = {10: frozenset({5}), 11: frozenset({6})}


@pytest.mark.parametrize(
    ("dag_filter", "groups"), [(DagFilter(exclude=("consumer",)), 0), (DagFilter(include=("cons*",)), 1)]
)
def test_the_dag_filter_chooses_the_dags(dag_filter: DagFilter, groups: int) -> None:
    found = find_trigger_event_duplicates([run(id=10), run(id=11)], TWO, PROVEN, dag_filter=dag_filter)
    assert len(found) == groups


def test_a_run_without_events_is_in_no_group() -> None:
    """An asset run whose consumed events are not in ``events`` (none read for it) links nothing."""
    [f] = find_trigger_event_duplicates([run(id=10), run(id=11), run(id=12)], TWO, PROVEN)
    assert (f.kept.id, [r.id for r in f.duplicates]) == (10, [11])


def test_groups_come_by_dag_then_run_after() -> None:
    later = T0 + timedelta(hours=1)
    runs: list[Run] = [
        run("orders_b", later, id=20),
        run("orders_b", later, id=21),
        run("orders_b", id=22),
        run("orders_b", id=23),
        run("orders_a", id=24),
        run("orders_a", id=25),
    ]
    events = {20: frozenset({1}), 21: frozenset({2}), 22: frozenset({3}), 23: frozenset({4})}
    events |= {24: frozenset({5}), 25: frozenset({6})}
    found_copies = [Copies(frozenset({1, 2}), True), Copies(frozenset({3, 4}), True), Copies(frozenset({5, 6}), True)]
    found = find_trigger_event_duplicates(runs, events, found_copies)
    assert [f.kept.id for f in found] == [24, 22, 20]


def test_a_copy_set_inside_one_run_is_not_shared() -> None:
    """Run 10 consumed both copies of a second message: that set links nothing, so it is not among the
    events the group shares (the note lists those)."""
    found_copies = [Copies(frozenset({5, 6}), True), Copies(frozenset({7, 8}), True)]
    [f] = find_trigger_event_duplicates(
        [run(id=10), run(id=11)], {10: frozenset({5, 7, 8}), 11: frozenset({6})}, found_copies
    )
    assert (f.kept.id, f.shared_event_ids) == (10, (5, 6))


def test_linked_sets_a_run_without_marks_links_nothing() -> None:
    """detect.linked_sets, the union-find both rules call: a run absent from ``marks`` has no marks."""
    a, b, c = run(id=10), run(id=11), run(id=12)
    assert linked_sets([a, b, c], {10: {"m"}, 11: {"m"}}) == [[a, b]]


def test_the_note_of_a_trigger_event_duplicate_names_its_airflow_bug() -> None:
    """plan._WHY's entry of this kind (module data, which mutmut leaves alone): the link an operator follows."""
    [f] = find_trigger_event_duplicates([run(id=10), run(id=11)], TWO, PROVEN)
    note = note_for(f, f.duplicates[0], T0)
    assert "one message, one asset event per triggerer running its trigger; see apache/airflow#65792" in note

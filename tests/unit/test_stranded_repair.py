"""The stranded-events repair's pure plan (detector.checks.stranded_events.rule_repair): which queue row, or why not."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from detector.checks.stranded_events.rule import CandidateEvent, StrandedSet
from detector.checks.stranded_events.rule_repair import (
    Refusal,
    RepairedRun,
    RepairState,
    Requeue,
    WindowEvent,
    plan_requeue,
    single_asset,
    verify,
)

T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
ASSET = {"asset": {"name": "orders", "uri": "s3://warehouse/orders", "group": "asset", "id": 1}}


def _event(event_id: int, seconds: float) -> CandidateEvent:
    return CandidateEvent(
        dag_id="orders_consumer", event_id=event_id, asset="orders", timestamp=T0 + timedelta(seconds=seconds),
        consumed=False, via_alias=False, partition_key=None, dag_paused=False, queue_rows=0, schedule_floor=None,
        run_id="asset_triggered__r", run_after=T0, run_created_at=None, run_queued_at=T0 + timedelta(seconds=9),
        run_clear_number=0,
    )  # fmt: skip


SET = StrandedSet(
    key="stranded_events|orders_consumer|asset_triggered__r",
    dag_id="orders_consumer",
    run_id="asset_triggered__r",
    run_after=T0,
    run_created=T0 + timedelta(seconds=9),
    events=(_event(2, 1), _event(3, 2)),
)
STATE = RepairState(
    dag_id="orders_consumer",
    paused=False,
    partitioned=False,
    expression={"all": [ASSET]},
    scheduled_assets=(1,),
    queue_rows=0,
    previous_run_after=T0,
    later_runs=(),
    window=(WindowEvent(2, 1, False), WindowEvent(3, 1, False)),
    consumed=(),
)


def test_a_single_asset_dag_gets_its_row_back_at_the_newest_stranded_event() -> None:
    """created_at = T (the newest event): the scheduler's window (previous run_after, T] is the set."""
    assert plan_requeue(SET, STATE) == Requeue("orders_consumer", (1,), T0 + timedelta(seconds=2), (2, 3))


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"queue_rows": 1}, "has a queue row now"),
        ({"consumed": (2,)}, "consumed by a run meanwhile"),
        ({"later_runs": ("asset_triggered__later",)}, "at or after the newest event"),
        ({"paused": True}, "is paused now"),
    ],
)
def test_a_state_that_moved_on_is_skipped(change: dict[str, object], why: str) -> None:
    plan = plan_requeue(SET, replace(STATE, **change))  # type: ignore[arg-type]
    assert isinstance(plan, Refusal) and plan.outcome == "skipped" and why in plan.reason


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"partitioned": True}, "partitioned DAG"),
        ({"expression": {"all": [ASSET, {"asset": {"name": "customers"}}]}}, "more than one asset"),  # AND
        ({"expression": {"any": [ASSET, {"asset": {"name": "customers"}}]}}, "more than one asset"),  # OR
        ({"expression": {"alias": {"name": "orders_alias"}}}, "an alias"),
        ({"scheduled_assets": (1, 2)}, "more than one asset"),
        ({"previous_run_after": None}, "no earlier asset run"),
        ({"window": (WindowEvent(1, 1, False), *STATE.window)}, "also [1]"),  # an older unconsumed event
        ({"window": (WindowEvent(1, 1, True), *STATE.window)}, "also [1]"),  # one another run consumed
        ({"window": STATE.window[1:]}, "without [2]"),  # a run between: the window misses e2
        ({"window": (WindowEvent(2, 7, False), WindowEvent(3, 7, False))}, "scheduled asset"),
    ],
)
def test_what_cannot_be_repaired_exactly_is_refused_with_the_reason(change: dict[str, object], why: str) -> None:
    plan = plan_requeue(SET, replace(STATE, **change))  # type: ignore[arg-type]
    assert isinstance(plan, Refusal) and plan.outcome == "refused" and why in plan.reason, plan


@pytest.mark.parametrize(
    ("expression", "single"),
    [
        (ASSET, True),
        ({"all": [ASSET]}, True),
        ({"any": [{"all": [ASSET]}]}, True),
        ({"all": [ASSET, ASSET]}, False),
        ({"asset_ref": {"name": "orders"}}, False),
        ({"alias": {"name": "a"}}, False),
        (None, False),
        ({}, False),
    ],
)
def test_single_asset_reads_airflows_serialized_condition(expression: object, single: bool) -> None:
    assert single_asset(expression) is single


def test_verify_wants_the_run_that_consumed_exactly_the_set() -> None:
    plan = plan_requeue(SET, STATE)
    assert isinstance(plan, Requeue)
    assert verify(plan, []) is None
    assert verify(plan, [RepairedRun("r1", (2,))]) is None  # a run that took only part of them
    assert verify(plan, [RepairedRun("r1", (2,)), RepairedRun("r2", (3, 2))]) == RepairedRun("r2", (3, 2))
    assert "ON CONFLICT DO NOTHING" in plan.describe() and "target_dag_id='orders_consumer'" in plan.describe()

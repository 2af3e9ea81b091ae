"""The stranded-events rule (detector.checks.stranded_events.rule): each look-alike of a stranded event on its own.

The Airflow-made fixtures (tests/integration/test_stranded_events.py) check the rule against what
Airflow recorded; here each condition is varied alone from one stranded event, so a rule that drops
any one of them fails.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from detector.checks.stranded_events.rule import KIND, CandidateEvent, find_stranded
from detector.core.detect import DagFilter

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)

# e2 of the race: after the run's run_after (its queue row's created_at), before the run was created.
STRANDED = CandidateEvent(
    dag_id="orders_consumer",
    event_id=3,
    asset="orders (s3://warehouse/orders)",
    timestamp=T0 + 2 * S,
    consumed=False,
    via_alias=False,
    partition_key=None,
    dag_paused=False,
    queue_rows=0,
    schedule_floor=T0 - 3600 * S,
    run_id="asset_triggered__r2",
    run_after=T0 + S,
    run_created_at=None,
    run_queued_at=T0 + 3 * S,
    run_clear_number=0,
)


def test_an_event_between_the_queue_row_and_the_run_creation_is_stranded() -> None:
    """The race's shape: one set keyed by (DAG, stranding run), with the event's facts."""
    [found] = find_stranded([STRANDED])
    assert found.key == f"{KIND}|orders_consumer|asset_triggered__r2"
    assert found.event_ids == (3,) and found.run_created == T0 + 3 * S


def test_events_of_one_stranding_run_form_one_set_in_time_order() -> None:
    e3 = replace(STRANDED, event_id=4, timestamp=T0 + 2.5 * S)
    other = replace(STRANDED, dag_id="other", run_id="r9")
    found = find_stranded([e3, other, STRANDED])
    assert [(s.dag_id, s.event_ids) for s in found] == [("orders_consumer", (3, 4)), ("other", (3,))]


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("consumed by a run", {"consumed": True}),
        ("an alias event", {"via_alias": True}),
        ("a partitioned event", {"partition_key": "2026-12-01"}),
        ("the DAG is paused", {"dag_paused": True}),
        ("a queue row is left (an AND/OR condition still waiting)", {"queue_rows": 1}),
        ("before the catchup floor", {"schedule_floor": T0 + 2 * S}),
        ("within the run's window", {"timestamp": T0 + S}),
        ("the run was created before the event", {"run_queued_at": T0 + 2 * S}),
        ("the run was cleared: queued_at is not its creation", {"run_clear_number": 1}),
        ("the run's created_at (3.2+) is before the event", {"run_created_at": T0 + 1.5 * S}),
    ],
)
def test_look_alikes_are_not_stranded(why: str, change: dict[str, object]) -> None:
    assert find_stranded([replace(STRANDED, **change)]) == [], why  # type: ignore[arg-type]


def test_created_at_wins_over_a_queued_at_rewritten_by_a_clear() -> None:
    """3.2+: a cleared run's created_at still dates its creation."""
    cleared = replace(STRANDED, run_clear_number=2, run_queued_at=T0 + 99 * S, run_created_at=T0 + 3 * S)
    assert [s.run_created for s in find_stranded([cleared])] == [T0 + 3 * S]


def test_dag_filter_and_since() -> None:
    assert find_stranded([STRANDED], dag_filter=DagFilter(exclude=("orders_*",))) == []
    assert find_stranded([STRANDED], since=T0 + 3 * S) == []
    assert len(find_stranded([STRANDED], since=T0 + 2 * S)) == 1

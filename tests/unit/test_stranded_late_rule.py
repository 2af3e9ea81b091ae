"""The committed-late rule (detector.checks.stranded_events.rule_late): each look-alike of
docs/explanation/airflow-internals.md,
"Committed late" varied alone from one late event, so a rule that drops any one condition fails. The Airflow-made
fixtures are judged in tests/integration/test_stranded_late.py."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from detector.checks.stranded_events.rule import KIND
from detector.checks.stranded_events.rule_late import REASON, LateCandidate, LateSet, find_late, observe_late
from detector.core.detect import DagFilter

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
S = timedelta(seconds=1)

# stranded_late_commit: e1 consumed by the earlier run at T0, late flushed at T0+1 s, e2's row at
# T0+2 s made the window run (run_after T0+2 s) while late was not committed.
LATE = LateCandidate(
    dag_id="orders_consumer",
    event_id=2,
    asset="orders (s3://warehouse/orders)",
    timestamp=T0 + S,
    via_alias=False,
    partition_key=None,
    schedule_since=T0 - 3600 * S,
    run_id="asset_triggered__r2",
    run_after=T0 + 2 * S,
    window_from=T0,
    queue_newest=None,
)


def test_an_event_inside_the_window_of_a_run_that_did_not_consume_it_is_reported() -> None:
    [found] = find_late([LATE])
    assert found.key == f"{KIND}|{REASON}|orders_consumer|asset_triggered__r2"
    assert found.event_ids == (2,) and found.run_after == T0 + 2 * S


def test_at_the_run_after_itself_is_inside_the_window() -> None:
    """Airflow's window is ``timestamp <= triggered_date``: an event at run_after belonged to the run."""
    assert find_late([replace(LATE, timestamp=LATE.run_after)])


@pytest.mark.parametrize(
    ("why", "change"),
    [
        (
            "after run_after: the next run's window (stranded_late_next_window) or the ordinary rule",
            {"timestamp": T0 + 3 * S},
        ),
        ("at the window's lower end: an earlier run consumed up to there", {"timestamp": T0}),
        ("before it: a purged or earlier run's window", {"timestamp": T0 - S}),
        ("linked to an alias", {"via_alias": True}),
        ("partitioned", {"partition_key": "2026-12-01"}),
        ("the asset joined the schedule after it", {"schedule_since": T0 + 1.5 * S}),
        ("at the reference's own time", {"schedule_since": T0 + S}),
        ("a queue row between it and run_after reaches back over it", {"queue_newest": T0 + 1.5 * S}),
        ("a queue row created at it reaches back over it", {"queue_newest": T0 + S}),
    ],
)
def test_look_alikes_are_not_reported(why: str, change: dict[str, object]) -> None:
    assert find_late([replace(LATE, **change)]) == [], why  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("why", "queue_newest"),
    [
        ("a row after the run: its run's window starts at run_after", T0 + 3 * S),
        ("a row at run_after: the same", T0 + 2 * S),
        ("a row before the event: its window ends before it", T0 + 0.5 * S),
    ],
)
def test_queue_rows_that_cannot_take_it_do_not_rescue_it(why: str, queue_newest: datetime) -> None:
    """Unlike a stranded event, a later event (and its queue row) does not help: still reported."""
    assert find_late([replace(LATE, queue_newest=queue_newest)]), why


def test_one_set_per_window_run_in_time_order_and_the_filters() -> None:
    e3 = replace(LATE, event_id=3, timestamp=T0 + 0.5 * S)
    other = replace(LATE, dag_id="other", run_id="r9")
    found = find_late([LATE, e3, other, LATE])
    assert [(s.dag_id, s.event_ids) for s in found] == [("orders_consumer", (3, 2)), ("other", (2,))]
    assert [s.dag_id for s in find_late([LATE, other], dag_filter=DagFilter(include=("other",)))] == ["other"]
    assert find_late([LATE, e3], since=T0 + S)[0].event_ids == (2,)


def test_the_observation_names_the_run_and_says_no_later_run_will_consume_it() -> None:
    [s] = find_late([LATE])
    obs = observe_late(s, T0 + 60 * S)
    assert obs.kind == KIND and obs.confidence == "confirmed" and isinstance(obs.subject, LateSet)
    assert obs.facts["reason"] == REASON and obs.facts["event_ids"] == [2]
    assert any(
        "committed after run asset_triggered__r2 read its events: no later run will consume it" in line
        for line in obs.lines
    )
    assert "does not repair" in obs.advice

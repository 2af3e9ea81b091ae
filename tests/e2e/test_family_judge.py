"""The stranded-events bookkeeping of the family report (``tests/e2e/family.judge_stranded``) on
hand-made rows: the end-to-end figures of stranded events are only as good as this comparison."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from tests.e2e.family import judge_stranded

T0 = datetime(2026, 12, 1, 20, 0, tzinfo=UTC)


def s(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def passed(dag: str, event: int, run: str, at: float, next_at: float | None, consumed: float | None) -> dict[str, Any]:
    return {
        "dag_id": dag,
        "event_id": event,
        "passed_by": run,
        "passed_at": s(at),
        "next_event_at": s(next_at) if next_at is not None else None,
        "consumed_at": s(consumed) if consumed is not None else None,
    }


def test_flagged_events_are_split_into_true_and_false_positives_and_missed_ones_keep_their_window() -> None:
    """Run r1 of ``a`` passed over events 2 and 3 (rescued 20 s later), r5 passed over 7 for good (seen
    until the end at 100 s); ``b``'s r2 passed over 4 for 1 s only. dupguard said 2 and 3 of ``a`` and
    event 9 (not passed over) and event 4 under the wrong DAG: two true positives, two false ones;
    missed: 7 (visible 10 s) and ``b``'s 4 (visible 1 s)."""
    rows = [
        passed("a", 2, "r1", 10, 30, 31),
        passed("a", 3, "r1", 10, 30, 31),
        passed("a", 7, "r5", 90, None, None),
        passed("b", 4, "r2", 10, 11, 12),
    ]
    said = [{"dag_id": "a", "event_ids": [2, 3]}, {"dag_id": "a", "event_ids": [9, 4]}]
    out = judge_stranded(rows, said, s(100))
    assert (out["passed_over"], out["passed_over_sets"], out["rescued_later"]) == (4, 3, 3)
    assert (out["flagged"], out["true_positives"]) == (4, 2)
    assert out["false_positives"] == [["a", 4], ["a", 9]]
    assert out["missed"] == [
        {"dag_id": "a", "event_id": 7, "observable_s": 10.0},
        {"dag_id": "b", "event_id": 4, "observable_s": 1.0},
    ]
    assert out["observable_s"] == [1.0, 10.0, 20.0, 20.0]


def test_nothing_passed_over_and_nothing_said_is_a_clean_run() -> None:
    out = judge_stranded([], [], s(0))
    assert (out["passed_over"], out["flagged"], out["true_positives"]) == (0, 0, 0)
    assert (out["false_positives"], out["missed"]) == ([], [])

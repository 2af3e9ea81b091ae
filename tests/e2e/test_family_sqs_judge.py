"""The SQS AssetWatcher's truth and its comparison with dupguard (``tests/e2e/family_sqs``) on hand-made
rows: the end-to-end figures of the ``trigger_event`` kind are only as good as this bookkeeping."""

from __future__ import annotations

from typing import Any

from tests.e2e.family_sqs import judge, truth_groups


def ev(event_id: int, message_id: str) -> dict[str, Any]:
    return {"event_id": event_id, "message_id": message_id}


def said(key: str, *runs: str) -> dict[str, Any]:
    return {"group_key": key, "runs": [{"run_id": r} for r in runs]}


def test_a_group_is_the_runs_of_one_message_and_groups_sharing_a_run_form_a_chain() -> None:
    """m1's copies (events 1, 2) went to r1 and r2, m2's (3, 4) to r2 and r3, m3's (5, 6) both to r4,
    m4 (7) to r5 alone, m5's copy 9 to no run: two groups ({r1, r2}, {r2, r3}) chained into one; m3 is
    copied but processed once; m5's unconsumed copy counts as a copy."""
    events = [ev(1, "m1"), ev(2, "m1"), ev(3, "m2"), ev(4, "m2"), ev(5, "m3"), ev(6, "m3"), ev(7, "m4")]
    events += [ev(8, "m5"), ev(9, "m5")]
    consumed = {1: {"r1"}, 2: {"r2"}, 3: {"r2"}, 4: {"r3"}, 5: {"r4"}, 6: {"r4"}, 7: {"r5"}, 8: {"r6"}}
    groups, chains, counts = truth_groups(events, consumed)
    assert groups == [{"r1", "r2"}, {"r2", "r3"}]
    assert chains == [{"r1", "r2", "r3"}]
    assert counts["messages_with_events"] == 5
    assert counts["copies"] == 4
    assert counts["messages_with_two_or_more_events"] == 4
    assert counts["messages_consumed_by_two_or_more_runs"] == 2
    assert counts["messages_consumed_by_no_run"] == []


def test_two_messages_copied_to_the_same_two_runs_are_one_group() -> None:
    """r1 consumed the first copies of m1 and m2 (one batch), r2 the second: one group, not two."""
    events = [ev(1, "m1"), ev(2, "m2"), ev(3, "m1"), ev(4, "m2")]
    groups, _, counts = truth_groups(events, {1: {"r1"}, 2: {"r1"}, 3: {"r2"}, 4: {"r2"}})
    assert groups == [{"r1", "r2"}]
    assert counts["messages_consumed_by_two_or_more_runs"] == 2


def test_groups_said_are_exact_merged_false_or_leave_a_miss() -> None:
    """Truth: {r1, r2}, {r2, r3} (a chain) and {r7, r8}. Said: {r1, r2} (exact, observed twice under one
    key), the whole chain (merged), {r3, r4} (false: r4 is in no group), {r1, r3} (false: not a union
    of groups). {r7, r8} is in no group said: missed."""
    truth = [{"r1", "r2"}, {"r2", "r3"}, {"r7", "r8"}]
    lines = [said("k1", "r1"), said("k1", "r1", "r2"), said("k2", "r1", "r2", "r3"), said("k3", "r3", "r4")]
    lines.append(said("k4", "r1", "r3"))
    out = judge(truth, lines)
    assert out["groups_said"] == 4
    assert out["exact"] == 1
    assert out["merged"] == ["k2"]
    assert out["false_positives"] == [
        {"group_key": "k3", "runs": ["r3", "r4"]},
        {"group_key": "k4", "runs": ["r1", "r3"]},
    ]
    assert out["missed"] == [["r7", "r8"]]


def test_two_groups_with_no_run_in_common_said_as_one_are_a_false_positive() -> None:
    """A group said whose truth groups share no run links runs no message links: false, and nothing missed."""
    out = judge([{"r1", "r2"}, {"r3", "r4"}], [said("k", "r1", "r2", "r3", "r4")])
    assert out["false_positives"] == [{"group_key": "k", "runs": ["r1", "r2", "r3", "r4"]}]
    assert out["missed"] == []

"""A run that consumed a copy of a message whose other copy an ``asset`` group's runs consumed (the SQS
end-to-end run, benchmarks/results/e2e_family-3.1.2-20261202-sqs.json: the two schedulers made two runs of
one queue row, both consumed copy 1; triggerer-2's copy 2 made a third run, which was in no group).

The asset group's kept run anchors the trigger_event group: kept there too, so the two groups never
stop every run that processed the message."""

from __future__ import annotations

from datetime import timedelta

from detector.core.detect import find_duplicates
from detector.core.model import Confidence, Finding, Kind, Run, TaskProgress
from detector.core.trigger_event import Copies, find_trigger_event_duplicates
from tests.factories import T0, run

COPIES = [Copies(frozenset({5, 6}), True)]  # events 5 and 6: two copies of one message, proven by its id


def _judge(runs: list[Run], events: dict[int, frozenset[int]]) -> tuple[list[Finding], list[Finding]]:
    asset_groups = find_duplicates(runs, events)
    return asset_groups, find_trigger_event_duplicates(runs, events, COPIES, beside=asset_groups)


def _stopped(groups: list[Finding]) -> set[int]:
    return {r.id for f in groups if f.confidence is Confidence.CONFIRMED for r in f.duplicates}


def test_the_run_of_the_second_copy_is_a_duplicate_of_the_asset_groups_kept_run() -> None:
    """a and b: one queue row, two schedulers (same run_after), both consumed event 5 (copy 1); c
    consumed event 6 (copy 2). Failed before: c was in no group ([] instead of a trigger_event group)."""
    a, b = run(id=10, job=1), run(id=11, job=2)
    c = run(id=12, job=1, run_after=T0 + timedelta(seconds=1))
    asset, found = _judge([a, b, c], {10: frozenset({5}), 11: frozenset({5}), 12: frozenset({6})})
    assert [(f.kind, f.kept.id, [r.id for r in f.duplicates]) for f in asset] == [(Kind.ASSET, 10, [11])]
    assert [(f.kind, f.confidence, f.kept.id, [r.id for r in f.duplicates]) for f in found] == [
        (Kind.TRIGGER_EVENT, Confidence.CONFIRMED, 10, [12])
    ]
    assert _stopped(asset + found) == {11, 12}  # the message is processed once, by a


def test_the_asset_groups_kept_run_stays_kept_even_when_another_run_started_first() -> None:
    """The keep rule alone would keep c here (its task started, lowest id among started runs): then a
    would be stopped by this group and b by the asset group, every run of that group."""
    a, b = run(id=10, job=1), run(id=11, job=2)
    c = run(id=9, job=1, run_after=T0 + timedelta(seconds=1))
    events = {10: frozenset({5}), 11: frozenset({5}), 9: frozenset({6})}
    started = {9: TaskProgress(total=1, started=1)}
    asset_groups = find_duplicates([a, b, c], events, started)
    found = find_trigger_event_duplicates([a, b, c], events, COPIES, started, beside=asset_groups)
    [kept] = [f.kept.id for f in asset_groups]
    assert [(f.confidence, f.kept.id) for f in found] == [(Confidence.CONFIRMED, kept)]
    assert kept not in _stopped(asset_groups + found)


def test_an_anchor_that_did_not_process_everything_leaves_the_group_suspected() -> None:
    """c consumed copy 2 and an event of its own (7): only c covers the group, so keeping c means
    stopping a, the asset group's kept run. Reported, never remediated."""
    a, b = run(id=10, job=1), run(id=11, job=2)
    c = run(id=12, job=1, run_after=T0 + timedelta(seconds=1))
    asset, found = _judge([a, b, c], {10: frozenset({5}), 11: frozenset({5}), 12: frozenset({6, 7})})
    assert [(f.kind, f.confidence) for f in found] == [(Kind.TRIGGER_EVENT, Confidence.SUSPECTED)]
    assert _stopped(asset + found) == {11}


def test_two_groups_kept_runs_linked_by_copies_are_only_suspected() -> None:
    """Copy 1 made the asset group {a, b}, copy 2 the asset group {c, d}: linking a and c would stop the
    kept run of one of them, the other's duplicate being stopped already."""
    a, b = run(id=10, job=1), run(id=11, job=2)
    later = T0 + timedelta(seconds=1)
    c, d = run(id=12, job=1, run_after=later), run(id=13, job=2, run_after=later)
    events = {10: frozenset({5}), 11: frozenset({5}), 12: frozenset({6}), 13: frozenset({6})}
    asset, found = _judge([a, b, c, d], events)
    assert sorted((f.kept.id, [r.id for r in f.duplicates]) for f in asset) == [(10, [11]), (12, [13])]
    assert [(f.confidence, sorted(r.id for r in f.runs)) for f in found] == [(Confidence.SUSPECTED, [10, 12])]
    assert _stopped(asset + found) == {11, 13}

"""A stranded event that is a trigger's copy of a consumed message (detector.checks.stranded_events.rule.with_copies):
reported as a copy, never as a lost event, and its set never re-queued (stranded_repair.plan_requeue)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from detector.actions.alerts.notice import observation_notice
from detector.checks.stranded_events.rule import ConsumedCopy, observe, with_copies
from detector.checks.stranded_events.rule_repair import Refusal, Requeue, plan_requeue
from detector.core.trigger_event import Copies
from tests.unit.test_stranded_repair import SET, STATE, T0

NOW = T0 + timedelta(minutes=5)
RUN = "asset_triggered__first"


def test_a_copy_of_a_consumed_event_is_marked_with_that_event_and_its_run() -> None:
    marked = with_copies(SET, [Copies(frozenset({1, 3}), proven=True)], {1: [RUN]})
    assert marked.copies == (ConsumedCopy(event_id=3, of_event=1, run_id=RUN, proven=True),)


def test_copies_no_run_consumed_are_not_marked() -> None:
    """Both copies stranded (or the consumed one consumed by another DAG, left out of ``consumers``)."""
    assert with_copies(SET, [Copies(frozenset({2, 3}), proven=True)], {}).copies == ()
    assert with_copies(SET, [Copies(frozenset({1, 3}), proven=True)], {4: [RUN]}).copies == ()


def test_a_proven_copy_wins_over_an_equal_payload() -> None:
    found = [Copies(frozenset({3, 5}), proven=False), Copies(frozenset({1, 3}), proven=True)]
    [copy] = with_copies(SET, found, {1: [RUN], 5: ["asset_triggered__other"]}).copies
    assert (copy.of_event, copy.proven) == (1, True)


def test_a_set_of_copies_only_is_a_warning_saying_nothing_is_to_re_run() -> None:
    found = [Copies(frozenset({1, 2, 3}), proven=True)]
    obs = observe(with_copies(SET, found, {1: [RUN]}), NOW)
    assert obs.severity == "warning" and "copies of consumed events" in obs.title
    assert "will not" not in obs.advice and "Nothing to re-run" in obs.advice
    assert not [line for line in obs.lines if "consumed by no run" in line]
    assert obs.facts["copies"] == [
        {"id": 2, "of_event": 1, "run_id": RUN, "proven": True},
        {"id": 3, "of_event": 1, "run_id": RUN, "proven": True},
    ]


def test_a_mixed_set_is_still_an_error_for_its_lost_event_and_names_the_copy() -> None:
    obs = observe(with_copies(SET, [Copies(frozenset({1, 3}), proven=True)], {1: [RUN]}), NOW)
    assert obs.severity == "error" and obs.title.startswith("1 asset event(s)") and "1 copy" in obs.title
    assert [line.split(": ", 1)[1] for line in obs.lines[1:3]] == [
        "consumed by no run",
        f"a copy (same message id) of event 1, which run {RUN} consumed: the trigger ran on two triggerers; "
        "nothing to re-run",
    ]


def test_an_equal_payload_copy_still_counts_as_lost_but_says_what_it_may_be() -> None:
    obs = observe(with_copies(SET, [Copies(frozenset({1, 3}), proven=False)], {1: [RUN]}), NOW)
    assert obs.severity == "error" and obs.title.startswith("2 asset event(s)")
    assert obs.lines[2].endswith(f"consumed by no run; maybe a copy (equal payload, no message id) of event 1, "
                                 f"which run {RUN} consumed")  # fmt: skip


def test_any_copy_in_the_set_refuses_the_repair_naming_it() -> None:
    """The window (previous run_after, T] holds every event of the set: the copy's message would run again,
    so a mixed set (a real stranded event and a copy) is refused too; so is a copy only maybe."""
    assert isinstance(plan_requeue(SET, STATE), Requeue)  # the same state without copies is repaired
    for proven in (True, False):
        marked = replace(SET, copies=(ConsumedCopy(3, 1, RUN, proven),))
        plan = plan_requeue(marked, STATE)
        assert isinstance(plan, Refusal) and plan.outcome == "refused"
        assert plan.reason.startswith("event 3 is ") and f"of event 1, which run {RUN} consumed" in plan.reason
        assert "process that message again" in plan.reason


def test_a_set_of_copies_only_goes_out_as_trigger_copies_a_mixed_set_as_stranded_events() -> None:
    """Alertmanager's alertname (and the runbook anchor of every channel) says what was found: copies
    of consumed messages only strand nothing (a trigger ran twice), a set with a lost event does."""
    only = observe(with_copies(SET, [Copies(frozenset({1, 2, 3}), proven=True)], {1: [RUN]}), NOW)
    mixed = observe(with_copies(SET, [Copies(frozenset({1, 3}), proven=True)], {1: [RUN]}), NOW)
    names = [observation_notice(o, "c", NOW).alertname for o in (only, mixed, observe(SET, NOW))]
    assert names == ["DupguardTriggerCopies", "DupguardStrandedEvents", "DupguardStrandedEvents"]
    assert only.kind == mixed.kind == "stranded_events"  # still the check's kind: scan, metrics, disabling

"""The keep rule's memory, pinned where mutation testing found it unpinned
(benchmarks/results/mutation.md).

``keep_order``'s first step (a run an earlier judgement kept stays kept) was deletable with every test
green: in the tests the kept run also won on the later steps. Here it is the only thing that keeps it.
"""

from __future__ import annotations

from detector.core.decisions import decisions_from_notes
from detector.core.detect import find_duplicates
from detector.core.model import Decisions, TaskProgress
from detector.core.plan import Mode, Outcome, note_for, plan
from tests.factories import T0, run

EVENTS = {1: frozenset({7}), 2: frozenset({7}), 3: frozenset({7})}
STARTED = TaskProgress(total=2, started=1)


def test_a_run_kept_before_stays_kept_when_a_lower_id_run_started_too() -> None:
    """Run 2 was kept (its task started first); stopping run 1 came too late (its task started
    meanwhile, so no note); run 3 was stopped with a note naming run 2. After a restart with no ledger,
    the notes alone say run 2 is kept: it stays kept although run 1 has the lower id and started too,
    and nothing is planned against it."""
    one, two, three = run(id=1), run(id=2), run(id=3)
    [first] = find_duplicates([one, two, three], EVENTS, {2: STARTED})
    assert first.kept == two  # the earlier judgement
    prior = decisions_from_notes([one, two, three], {3: note_for(first, three, T0)})
    assert prior.kept == {2} and prior.stopped == {3}

    [f] = find_duplicates([one, two, three], EVENTS, {1: STARTED, 2: STARTED}, prior=prior)
    assert f.kept == two
    assert [d.id for d in f.duplicates] == [1, 3]
    outcomes = {a.run.id: a.outcome for a in plan([f], Mode.FAIL, now=T0)}
    assert outcomes == {1: Outcome.TOO_LATE, 3: Outcome.STOPPED_BEFORE}
    assert {a.kept_run_id for a in plan([f], Mode.FAIL, now=T0)} == {two.run_id}


def test_a_run_kept_before_stays_kept_over_a_started_run_with_a_lower_id_in_a_partition() -> None:
    """The same memory on the partitioned path: two runs of one partition with the same events, the
    ledger kept run 2; run 1 started later (too late to stop). Run 2 stays the kept run."""
    one, two = run(id=1, partition_key="2026-03-12"), run(id=2, partition_key="2026-03-12")
    prior = Decisions(kept=frozenset({2}))
    [f] = find_duplicates([one, two], EVENTS, {1: STARTED}, prior=prior)
    assert f.kept == two and f.duplicates == (one,)
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.run == one and action.outcome is Outcome.TOO_LATE and not action.writes


def test_a_run_kept_before_stays_kept_over_a_lower_id_run_nobody_judged() -> None:
    """A run kept before with nothing started anywhere still beats a lower id the ledger never saw
    (a run the source listed late): the decision is final, so the kept run is not swapped."""
    one, two = run(id=1), run(id=2)
    [f] = find_duplicates([one, two], EVENTS, prior=Decisions(kept=frozenset({2})))
    assert f.kept == two and f.duplicates == (one,)
    [action] = plan([f], Mode.FAIL, now=T0)
    assert action.run == one and action.outcome is Outcome.REMEDIATE and action.kept_run_id == two.run_id

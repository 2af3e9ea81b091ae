"""NewRowTracker: late commits with lower ids are seen once, memory stays bounded."""

from __future__ import annotations

from datetime import timedelta

from detector.sources.database.poll import NewRowTracker
from tests.factories import T0


def test_returns_each_id_once() -> None:
    """Ids above the high-water mark are new exactly once."""
    t = NewRowTracker(high=10)
    assert t.accept([11, 12], T0) == [11, 12]
    assert t.accept([11, 12], T0) == []
    assert t.high == 12


def test_late_commit_with_lower_id_is_still_reported() -> None:
    """Id 12 is visible before 11 commits; 11 is remembered as a gap and reported when it appears."""
    t = NewRowTracker(high=10)
    assert t.accept([12], T0) == [12]
    assert t.open_gaps() == [11]
    assert t.accept([11], T0 + timedelta(seconds=1)) == [11]
    assert t.open_gaps() == []


def test_gap_expires_after_grace() -> None:
    """A rolled-back insert never fills its gap; it is forgotten after the grace period."""
    t = NewRowTracker(high=0, grace=timedelta(seconds=30))
    t.accept([3], T0)
    assert t.open_gaps() == [1, 2]
    t.accept([], T0 + timedelta(seconds=31))
    assert t.open_gaps() == []


def test_gap_count_is_bounded() -> None:
    """A huge id jump (sequence cache, restore) cannot make the tracker grow without bound."""
    t = NewRowTracker(high=0, max_gaps=100)
    t.accept([1_000_000], T0)
    assert len(t.open_gaps()) == 100
    assert t.gaps_dropped == 1_000_000 - 1 - 100


def test_memory_ledger_claims_once_and_stays_bounded() -> None:
    """A claim is won once; the in-memory ledger forgets its oldest entries past its bound."""
    from detector.app.ledger import MemoryLedger

    ledger = MemoryLedger(max_entries=3)
    assert ledger.claim_all("g1", ["detected", "action:r2"]) == {"detected", "action:r2"}
    assert ledger.claim_all("g1", ["detected", "action:r3"]) == {"action:r3"}
    for i in range(10):
        ledger.claim(f"g{i + 2}", "detected")
    assert len(ledger._claims) == 3


def test_expired_gap_is_rescanned_and_a_late_commit_reported() -> None:
    """A gap past the grace period is asked for again (at the re-scan cadence) and, when its run
    finally commits, it is returned as new and reported as late, with how late it was."""
    t = NewRowTracker(high=0, grace=timedelta(seconds=30), late_every=timedelta(seconds=1))
    t.accept([2], T0)
    t.accept([], T0 + timedelta(seconds=31))
    assert t.open_gaps() == []
    assert t.ids_to_check(T0 + timedelta(seconds=31)) == [1]  # re-scan due
    assert t.ids_to_check(T0 + timedelta(seconds=31.5)) == []  # not again before late_every
    assert t.accept([1], T0 + timedelta(seconds=95)) == [1]
    late, abandoned = t.drain()
    assert late == [(1, 95.0)] and abandoned == 0
    assert t.late == {}


def test_late_gap_is_abandoned_and_counted_after_the_horizon() -> None:
    """An id never committed (a rolled-back insert) is given up after the horizon, and counted."""
    t = NewRowTracker(high=0, grace=timedelta(seconds=30), late_horizon=timedelta(minutes=10))
    t.accept([2], T0)
    t.accept([], T0 + timedelta(seconds=31))
    assert t.lowest_unseen() == 1
    t.accept([], T0 + timedelta(minutes=11))
    assert t.drain() == ([], 1)
    assert t.lowest_unseen() is None

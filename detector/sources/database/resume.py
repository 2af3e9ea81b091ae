"""Where a leader term of the database source starts reading.

A term resumes where this process stopped judging, whatever the gap's age: an outage longer than
``--startup-lookback`` used to lose every duplicate in it silently, and every term change re-read the
look-back (8 s for 6,500 runs) before new runs were judged. What the process has not judged:

- its own last term's tracker (watermark, open gaps and late ids), kept in memory across terms;
- moved up to what a live leader elsewhere has had time to judge while this process stood by: the
  newest id one leader check before the latest check that still found that leader alive (the leader
  polls at least every 250 ms by default, at rest, so a whole check interval covers its lag). Without
  that, with in-memory ledgers a standby that takes over would judge (and alert) its predecessor's whole term again.

The durable ledger's watermark, shared by the replicas, comes first when there is one; the look-back
only serves a process that never watched (its first start, without a durable watermark).

A gap is bounded by what can still be judged, and never silent (one ``coverage_gap`` warning, the
``dupguard_coverage_gaps_total`` count and the health reason name its ids): ids deleted from
``dag_run`` before they were judged (``airflow db clean``: the table's lowest id is above the
watermark), and ids more than ``CATCH_UP_LIMIT`` below the newest (judged at about 2 ms a run, the
limit keeps a term's catch-up to a few minutes, during which new runs wait; ``dupguard scan --since``
audits the rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection

from detector.metadb import dag_runs
from detector.metadb.schema import AirflowTables
from detector.sources.database.poll import NewRowTracker

CATCH_UP_LIMIT = 100_000  # ids below max(id) a term reads back at most (resumed, or the look-back's search)

TrackerState = tuple[int, dict[int, datetime], dict[int, datetime]]  # high, open gaps, late ids


def state_of(tracker: NewRowTracker) -> TrackerState:
    return tracker.high, tracker.gaps.copy(), tracker.late.copy()


@dataclass(frozen=True)
class CoverageGap:
    """dag_run ids [first_id, last_id] that no term will judge."""

    first_id: int
    last_id: int
    why: str
    queued_from: datetime | None  # of the lowest and highest of those runs still in the table
    queued_to: datetime | None

    def reason(self) -> str:
        when = ""
        if self.queued_from is not None and self.queued_to is not None:
            when = f", queued {self.queued_from.isoformat()} to {self.queued_to.isoformat()}"
        return f"coverage gap: dag_run ids {self.first_id}-{self.last_id}{when} were never judged ({self.why})"


@dataclass
class Progress:
    """What this process need not judge again (module docstring). Only the polling thread calls it."""

    own: TrackerState | None = None  # the last term's tracker
    covered: int | None = None  # judged by a live leader elsewhere
    seen: int | None = None  # newest id read by this standby's last ping
    _pending: int | None = None  # newest id at the previous check that found a live leader

    def ended(self, tracker: NewRowTracker) -> None:
        self.own = state_of(tracker)

    def stood_by(self, live_leader: bool) -> None:
        """One standby check; ``seen`` was read by its ping."""
        if live_leader and self._pending is not None:
            self.covered = max(self.covered or 0, self._pending)
        self._pending = self.seen if live_leader else None
        self.seen = None

    def resumed(self) -> TrackerState | None:
        """The state a term starts from, or None (never watched: the look-back)."""
        if self.own is None:
            return None if self.covered is None else (self.covered, {}, {})
        high, gaps, late = self.own
        if self.covered is None or self.covered <= high:
            return high, gaps.copy(), late.copy()
        # Ids the other leader had time to judge, this process's open gaps below them included.
        return self.covered, {}, {}


def bounded(
    conn: Connection, t: AirflowTables, state: TrackerState, top: int
) -> tuple[TrackerState, CoverageGap | None]:
    """``state`` moved up past what cannot be judged any more; the gap that leaves, if any."""
    high, gaps, late = state
    start, whys = high, []
    lowest = dag_runs.min_run_id(conn, t)
    if lowest is not None and lowest - 1 > start:
        start = lowest - 1
        whys.append("deleted from dag_run before they were judged, e.g. by airflow db clean")
    if top - CATCH_UP_LIMIT > start:
        start = top - CATCH_UP_LIMIT
        whys.append(f"more than {CATCH_UP_LIMIT} ids behind the newest run; audit them with dupguard scan --since")
    if start == high:
        return state, None
    queued_from, queued_to = dag_runs.queued_at_of_ids(conn, t, high + 1, start)
    gap = CoverageGap(high + 1, start, "; ".join(whys), queued_from, queued_to)
    return (start, {i: s for i, s in gaps.items() if i > start}, {i: s for i, s in late.items() if i > start}), gap

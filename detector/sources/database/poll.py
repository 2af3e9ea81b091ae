"""Incremental detection for the daemon: each poll examines only runs that became visible since the last.

``dag_run.id`` comes from a sequence taken at INSERT, not at COMMIT, so a run can become visible
after a run with a higher id. ``NewRowTracker`` therefore remembers the ids it skipped over
("gaps") and asks for them again until they appear or are older than ``grace`` (a rolled-back
insert never fills its gap). State is the highest id seen plus the open gaps: bounded memory over
weeks of running.

A gap older than ``grace`` is not forgotten: it becomes *late* and is asked for again once a
``late_every`` (not at every poll, which stays one index range scan) until ``late_horizon``. A late
id that appears is reported (the daemon logs a warning and counts ``dupguard_late_runs_total``) and
judged like any new run; one never seen within the horizon is counted as abandoned (almost always a
rolled-back insert). Siblings of a new run are looked up in the database, never in memory, so a
duplicate whose first run is far below the watermark is still found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from sqlalchemy import Connection

from detector.core.detect import ALL_DAGS, DEFAULT_SUSPECT_WINDOW, DagFilter, find_duplicates
from detector.core.model import ASSET_TRIGGERED, NO_DECISIONS, Decisions, Finding, Run, TaskProgress, asset_labels
from detector.core.reprocess import needs_origins, refine_partitioned
from detector.core.trigger_event import IdPaths, find_trigger_event_duplicates
from detector.metadb import consumption, dag_runs, partitions, siblings
from detector.metadb.prepared import TopRunId
from detector.metadb.schema import AirflowTables
from detector.sources.database import copies
from detector.sources.database.prior import notes_readable

DEFAULT_GRACE = timedelta(seconds=60)
DEFAULT_MAX_GAPS = 10_000
DEFAULT_BATCH = 1_000
MAX_HOPS = 3  # sibling-of-sibling lookups when a new run has siblings
# Earlier keep decisions about a group's runs (detector.sources.database.prior), from their task progress and
# notes (read with them) and the ledger: read just before the group is judged.
PriorSource = Callable[[Connection, Sequence[Run], Mapping[int, TaskProgress], Mapping[int, str]], Decisions]
DEFAULT_LATE_HORIZON = timedelta(hours=1)
DEFAULT_LATE_EVERY = timedelta(seconds=1)


@dataclass
class NewRowTracker:
    """Which ids are new. Pure: the caller passes the fetched ids and ``now``."""

    high: int
    grace: timedelta = DEFAULT_GRACE
    max_gaps: int = DEFAULT_MAX_GAPS
    gaps: dict[int, datetime] = field(default_factory=dict)
    gaps_dropped: int = 0  # gaps given up because there were too many to track
    late_horizon: timedelta = DEFAULT_LATE_HORIZON
    late_every: timedelta = DEFAULT_LATE_EVERY
    late: dict[int, datetime] = field(default_factory=dict)  # expired gaps, re-scanned until the horizon
    late_checked: datetime | None = None
    found_late: list[tuple[int, float]] = field(default_factory=list)  # (id, seconds since skipped), to drain
    abandoned: int = 0  # ids given up (horizon passed, or too many), to drain

    def open_gaps(self) -> list[int]:
        return sorted(self.gaps)

    def ids_to_check(self, now: datetime) -> list[int]:
        """The open gaps, plus the late ids when their re-scan is due."""
        if self.late and (self.late_checked is None or now - self.late_checked >= self.late_every):
            self.late_checked = now
            return sorted(self.gaps.keys() | self.late.keys())
        return sorted(self.gaps)

    def lowest_unseen(self) -> int | None:
        pending = self.gaps.keys() | self.late.keys()
        return min(pending) if pending else None

    def drain(self) -> tuple[list[tuple[int, float]], int]:
        """Late ids found and ids abandoned since the last drain."""
        found, self.found_late = self.found_late, []
        abandoned, self.abandoned = self.abandoned, 0
        return found, abandoned

    def accept(self, ids: Sequence[int], now: datetime) -> list[int]:
        """Record the ids a fetch returned; return the ones never seen before, ascending."""
        fresh = sorted({i for i in ids if i > self.high or i in self.gaps or i in self.late})
        for i in fresh:
            self.gaps.pop(i, None)
            skipped_at = self.late.pop(i, None)
            if skipped_at is not None:
                self.found_late.append((i, (now - skipped_at).total_seconds()))
        if fresh and fresh[-1] > self.high:
            visible = set(fresh)
            for missing in range(self.high + 1, fresh[-1]):
                if missing in visible:
                    continue
                if len(self.gaps) >= self.max_gaps:
                    self.gaps_dropped += 1
                    self.abandoned += 1
                    continue
                self.gaps[missing] = now
            self.high = fresh[-1]
        expired = [i for i, since in self.gaps.items() if now - since > self.grace]
        for i in expired:
            since = self.gaps.pop(i)
            if len(self.late) < self.max_gaps:
                self.late[i] = since
            else:
                self.abandoned += 1
        gone = [i for i, since in self.late.items() if now - since > self.late_horizon]
        for i in gone:
            del self.late[i]
        self.abandoned += len(gone)
        return fresh


@dataclass(frozen=True)
class PollResult:
    new_runs: list[Run]
    findings: list[Finding]
    batch_full: bool  # more rows are waiting: poll again at once
    late: tuple[tuple[int, float], ...] = ()  # (run id, seconds after its id was skipped over)
    abandoned: int = 0  # ids given up on in this poll


IDLE = PollResult(new_runs=[], findings=[], batch_full=False)  # nothing new: shared, never mutated


@dataclass
class IncrementalDetector:
    tables: AirflowTables
    tracker: NewRowTracker
    dag_filter: DagFilter = ALL_DAGS
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW
    id_paths: IdPaths = ()  # message_id_paths: where custom triggers keep their messages' ids
    batch: int = DEFAULT_BATCH
    prior: PriorSource | None = None

    def poll(self, conn: Connection, now: datetime, probe: TopRunId | None = None) -> PollResult:
        """One poll: fetch what became visible, then judge each new asset run with its siblings.

        With a ``probe`` (``detector.metadb.prepared``) and no gap due for a re-check, the highest visible
        id is asked first, and the full fetch is sent only when it is above the watermark: the idle
        poll is one prepared statement. A gap can fill without moving the top id, so open gaps (and
        due late ids) always take the full fetch.
        """
        t = self.tables
        due = self.tracker.ids_to_check(now)
        if probe is not None and not due and probe() <= self.tracker.high:
            return IDLE
        fetched = dag_runs.new_runs(conn, t, self.tracker.high, due, self.batch)
        fresh_ids = set(self.tracker.accept([r.id for r in fetched], now))
        new = [r for r in fetched if r.id in fresh_ids]
        watched = [r for r in new if r.run_type == ASSET_TRIGGERED and self.dag_filter.selects(r.dag_id)]
        findings = self.judge(conn, watched, now) if watched else []
        late, abandoned = self.tracker.drain()
        return PollResult(
            new_runs=new,
            findings=findings,
            batch_full=len(fetched) >= self.batch,
            late=tuple(late),
            abandoned=abandoned,
        )

    def judge(self, conn: Connection, watched: list[Run], now: datetime) -> list[Finding]:
        """The groups ``watched`` runs belong to, judged with their siblings and earlier decisions.

        Also used to re-judge a duplicate before a remediation is retried."""
        t = self.tables
        consumed = consumption.consumed_with_assets(conn, t, [r.id for r in watched], self.id_paths)
        events = dict(consumed.events)
        candidates: dict[int, Run] = {r.id: r for r in watched}
        alone = True
        for run_id, its_siblings in siblings.siblings_of_runs(conn, t, watched, events, self.suspect_window).items():
            for sibling in its_siblings:
                candidates.setdefault(sibling.id, sibling)
                alone = alone and sibling.id == run_id
        # Runs that consumed another copy of a message one of these runs' trigger events carried.
        found_copies, consumers = copies.near_runs(
            conn, t, watched, consumed.triggers, self.suspect_window, self.id_paths
        )
        for consumer in consumers:
            candidates.setdefault(consumer.id, consumer)
        alone = alone and len(consumers) < 2  # one run holding every copy makes no group
        if alone:
            return []  # the common case: every new run is the only one of its trigger
        new_ids = {r.id for r in watched}
        ids = list(candidates)
        events.update(consumption.consumed_events(conn, t, [i for i in ids if i not in new_ids]))  # new ones are read
        # A group is a connected set (detect.py): the siblings' own siblings belong to it too, e.g. the
        # exact duplicate of a run that a new, overlapping run shares an event with. Only a sibling
        # with another run_after or an event not looked up yet can lead further (an exact pair never
        # does, so its poll sends no extra query). Bounded: real groups are two or three runs.
        asked = {(r.dag_id, r.run_after, r.partition_key) for r in watched}
        asked_events = {(r.dag_id, e) for r in watched for e in events.get(r.id, ())}
        frontier = [candidates[i] for i in ids if i not in new_ids]
        for _ in range(MAX_HOPS):
            frontier = [
                r
                for r in frontier
                if (r.dag_id, r.run_after, r.partition_key) not in asked
                or any((r.dag_id, e) not in asked_events for e in events.get(r.id, ()))
            ]
            found: dict[int, Run] = {}
            for run in frontier:
                asked.add((run.dag_id, run.run_after, run.partition_key))
                asked_events.update((run.dag_id, e) for e in events.get(run.id, ()))
            for its_siblings in siblings.siblings_of_runs(conn, t, frontier, events, self.suspect_window).values():
                for sibling in its_siblings:
                    if sibling.id not in candidates:
                        found[sibling.id] = sibling
            if not found:
                break
            candidates.update(found)
            events.update(consumption.consumed_events(conn, t, list(found)))
            frontier = list(found.values())
        ids = list(candidates)
        with notes_readable():  # the notes (earlier decisions, the guard's): the missing grant is named
            progress, notes = consumption.progress_and_notes(conn, t, ids, now)
        runs = list(candidates.values())
        prior = self.prior(conn, runs, progress, notes) if self.prior is not None else NO_DECISIONS
        findings = find_duplicates(
            candidates.values(),
            events,
            progress,
            dag_filter=self.dag_filter,
            suspect_window=self.suspect_window,
            prior=prior,
        )
        suspects = [r.id for f in findings if needs_origins(f) for r in f.runs]
        if suspects:  # rare: partitioned runs of one key with different events (detector.core.reprocess)
            origins = partitions.partition_rows_for_runs(conn, t, suspects)
            findings = refine_partitioned(findings, origins, events, progress, suspect_window=self.suspect_window)
        if found_copies:
            findings += find_trigger_event_duplicates(
                candidates.values(),
                events,
                found_copies,
                progress,
                prior=prior,
                beside=findings,
                dag_filter=self.dag_filter,
            )
        mine = [f for f in findings if any(r.id in new_ids for r in f.runs)]
        return self._named(conn, mine, events, consumed.assets)

    def _named(
        self,
        conn: Connection,
        findings: list[Finding],
        events: Mapping[int, frozenset[int]],
        known: Mapping[int, tuple[str, str]],
    ) -> list[Finding]:
        """The groups with the assets their runs' events belong to, for the alerts. ``known``: the assets
        read with the new runs' events; only another event of a group (an older run's) is asked for."""
        consumed = {f.key: sorted({e for r in f.runs for e in events.get(r.id, ())}) for f in findings}
        wanted = [e for ids in consumed.values() for e in ids if e not in known]
        names = {**known, **consumption.event_assets(conn, self.tables, wanted)} if wanted else known
        return [replace(f, assets=asset_labels(names[e] for e in consumed[f.key] if e in names)) for f in findings]

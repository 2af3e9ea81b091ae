"""The database source as the daemon sees it (``core.ports.RunSource``): a term starts where this
process stopped judging, at the durable watermark, or else at the look-back (``resume``); each poll
tails ``dag_run`` by id (``poll.IncrementalDetector``) on one long-lived autocommit connection, and a
failed poll is rewound so no run is lost.
"""

from __future__ import annotations

import contextlib
from datetime import datetime
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from detector import logs
from detector.config import Config
from detector.core.detect import DagFilter
from detector.core.model import ASSET_TRIGGERED, NO_PROGRESS, Finding
from detector.core.pace import stirred
from detector.core.ports import Ledger, Polled
from detector.errors import DatabaseError, DupguardError, LedgerFault
from detector.metadb import catalog, consumption, dag_runs, siblings
from detector.metadb.engine import AirflowDb, connect, describe_error
from detector.metadb.prepared import QueueProbe, queues_unreadable, top_run_id_probe
from detector.metrics import Metrics
from detector.sources.database import resume
from detector.sources.database.poll import IDLE, IncrementalDetector, NewRowTracker
from detector.sources.database.prior import PriorDecisions

log = logs.get("dupguard.daemon")
# Idle polls: shared, never mutated.
NOTHING_NEW = Polled(new_runs=0, findings=[], stirred=False)
QUEUES_CHANGED = Polled(new_runs=0, findings=[], stirred=True)


class DatabaseSource:
    name = "database"

    def __init__(self, config: Config, db: AirflowDb, ledger: Ledger, metrics: Metrics) -> None:
        self.config = config
        self.db = db
        self.ledger = ledger
        self.metrics = metrics
        self.family = db.info.family.value
        self.detector: IncrementalDetector | None = None
        self._conn: Connection | None = None
        self._probe: QueueProbe | None = None  # bound to ``_conn``
        self._queues: tuple[Any, ...] | None = None  # the asset queues' fingerprint the probe read last
        self._read: tuple[Any, ...] | None = None  # ... in this pass (None: the pass did not probe)
        self.probe_prepared: bool | None = None  # logged when it changes
        self.queues_unreadable: str | None = None  # why the probe reads no queue fingerprint; logged when it changes
        self._saved: resume.TrackerState | None = None
        self._progress = resume.Progress()  # what the next term need not judge again
        self._inherited: list[Finding] = []  # groups a resumed term judges again (``_unfinished_before``)
        self._saved_inherited: list[Finding] = []
        self.coverage_gap: str | None = None  # the last gap a term start reported (a health reason)
        self._advanced = False  # the last poll saw new runs: the watermark moves once they are handled
        self._filter = DagFilter(config.dags, config.exclude_dags)
        self._prior = PriorDecisions(db.tables, ledger)
        # Re-judges one duplicate's group before a retry (no tracker state of its own is used).
        self._rejudger = IncrementalDetector(
            tables=db.tables,
            tracker=NewRowTracker(high=0),
            dag_filter=self._filter,
            suspect_window=config.suspect_window,
            id_paths=config.message_id_paths,
            prior=self._prior,
        )

    @property
    def watching(self) -> bool:
        return self.detector is not None

    def ping(self) -> str | None:
        """A standby's ping reads the newest id (the same one round trip): ``stood_by`` needs it."""
        try:
            with connect(self.db.engine) as conn:
                if self.detector is None:
                    self._progress.seen = dag_runs.max_run_id(conn, self.db.tables)
                else:
                    catalog.ping(conn)
        except DupguardError as exc:
            return str(exc)
        return None

    def resume_point(self) -> int | None:
        """The id after which the next term would read, before ``resume.bounded`` (None: the look-back)."""
        state = self._progress.resumed()
        return None if state is None else state[0]

    def start(self, now: datetime) -> None:
        """Where a new leader term starts reading (``resume``). Ages are measured on the database's
        clock, on the connection that reads the runs, since this host's may be off: ``now`` is this host's."""
        t = self.db.tables
        watermark = self._durable_watermark()
        state = (watermark, {}, {}) if watermark is not None else self._progress.resumed()
        how = "ledger" if watermark is not None else "lookback" if state is None else "resumed"
        with connect(self.db.engine) as conn:
            top = dag_runs.max_run_id(conn, t)
            if state is None:
                since = catalog.database_now(conn) - self.config.startup_lookback
                first = dag_runs.first_run_id_since(conn, t, since, max(0, top - resume.CATCH_UP_LIMIT))
                state, gap = (top if first is None else first - 1, {}, {}), None
                if not self.ledger.durable and self.config.remediation in {"fail", "skip"}:
                    self._inherited = self._not_started_before(conn, state[0], now)
            else:
                state, gap = resume.bounded(conn, t, state, top)
                if not self.ledger.durable and self.config.remediation in {"fail", "skip"}:
                    self._inherited = self._unfinished_before(conn, state[0], now)
            with contextlib.suppress(SQLAlchemyError):  # a missing grant is reported where judging needs it
                siblings.warm(conn, t)
                consumption.warm(conn, t)
        if gap is not None:
            self._report_gap(gap)
        high, gaps, late = state
        tracker = NewRowTracker(high=high, grace=self.config.gap_grace, gaps=gaps, late=late)
        self.detector = IncrementalDetector(
            tables=t,
            tracker=tracker,
            dag_filter=self._filter,
            suspect_window=self.config.suspect_window,
            id_paths=self.config.message_id_paths,
            prior=self._prior,
        )
        log.info("watching", from_id=high, durable_ledger=self.ledger.durable, start=how, gaps=len(gaps) + len(late))

    def _durable_watermark(self) -> int | None:
        """The ledger's watermark; None (resume or look back) while the ledger is broken (reported)."""
        if not self.ledger.durable:
            return None
        try:
            return self.ledger.watermark()
        except LedgerFault:
            return None

    def end(self) -> None:
        if self.detector is not None:  # the next term resumes here (``resume``)
            self._progress.ended(self.detector.tracker)
        self.detector = None

    def stood_by(self, live_leader: bool) -> None:
        self._progress.stood_by(live_leader)

    def poll(self, now: datetime) -> Polled:
        detector = self.detector
        assert detector is not None, "start() opens a term before the first poll"
        tracker = detector.tracker
        self._saved = (tracker.high, tracker.gaps.copy(), tracker.late.copy())
        self._saved_inherited = self._inherited
        conn = self._poll_connection()
        inherited = self._inherited
        self._read = None
        result = detector.poll(conn, now, self._top_run_id)
        self._inherited = []  # restored by ``failed`` if these findings are not handled
        before, after = self._queues, self._read
        if after is not None:
            self._queues = after
        if result is IDLE:
            stir = stirred(before, after, 0)
            if inherited:
                return Polled(new_runs=0, findings=inherited, ledger=self.ledger.on(conn), stirred=stir)
            return QUEUES_CHANGED if stir else NOTHING_NEW
        self._report_late(result.late, result.abandoned)
        self._advanced = bool(result.new_runs)
        # The ledger's statements on the poll connection: no pool checkout on the detection path.
        findings = inherited + result.findings
        ledger = self.ledger.on(conn) if findings else None
        asset_runs = sum(r.run_type == ASSET_TRIGGERED for r in result.new_runs)
        return Polled(
            new_runs=len(result.new_runs),
            findings=findings,
            more=result.batch_full,
            ledger=ledger,
            stirred=stirred(before, after, asset_runs),
            asset_runs=asset_runs,
        )

    def _top_run_id(self) -> int:
        """The probe's top id for the detector; its queue fingerprint is kept for ``poll``."""
        assert self._probe is not None  # opened with the poll connection
        top, self._read = self._probe()
        return top

    def commit(self) -> None:
        if self._advanced and self.ledger.durable and self.detector is not None:
            ledger = self.ledger if self._conn is None else self.ledger.on(self._conn)
            with contextlib.suppress(LedgerFault):  # reported; only a restart's resume point waits for it
                ledger.save_watermark(_safe_watermark(self.detector.tracker))
        self._advanced = False

    def failed(self, exc: BaseException) -> str:
        self._drop_poll_connection()
        if self.detector is not None and self._saved is not None:
            tracker = self.detector.tracker
            tracker.high, tracker.gaps, tracker.late = self._saved
            tracker.found_late = []  # restored late ids are found again by the next pass
            self._inherited = self._saved_inherited
        self._saved = None
        if isinstance(exc, SQLAlchemyError):
            return describe_error(exc, self.db.engine.url)
        return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

    def rejudge(self, dag_id: str, run_id: str, now: datetime) -> list[Finding] | None:
        t = self.db.tables
        with connect(self.db.engine) as conn:
            run = dag_runs.run_by_run_id(conn, t, dag_id, run_id)
            if run is None:
                return None
            return self._rejudger.judge(conn, [run], now)

    def _unfinished_before(self, conn: Connection, resumed_at: int, now: datetime) -> list[Finding]:
        """The groups of the look-back's runs up to ``resumed_at`` that are still queued or running.

        Without a durable ledger nothing lists the stops a previous leader could not finish (its write
        refused by the fence, its process gone): a term that resumes past its predecessor's ids would
        leave those duplicates running. Only unfinished runs can still be stopped, so only their groups
        are judged again (an index read, not the look-back's history), and only where dupguard writes:
        alerting alone has nothing to finish. Their alerts may repeat, as docs/explanation/daemon.md says
        for the in-memory ledger."""
        since = catalog.database_now(conn) - self.config.startup_lookback
        floor = dag_runs.first_run_id_since(conn, self.db.tables, since, max(0, resumed_at - resume.CATCH_UP_LIMIT))
        if floor is None or floor > resumed_at:
            return []
        runs = dag_runs.unfinished_asset_runs(conn, self.db.tables, floor - 1, resumed_at, resume.CATCH_UP_LIMIT)
        findings = self._rejudger.judge(conn, runs, now) if runs else []
        if findings:
            log.info("resumed_unfinished_groups", groups=len(findings), runs=len(runs), upto_id=resumed_at)
        return findings

    def _not_started_before(self, conn: Connection, upto: int, now: datetime) -> list[Finding]:
        """A first term without a durable ledger: the groups, below the look-back, of asset runs still
        queued or running (at most ``resume.CATCH_UP_LIMIT`` ids back) with a duplicate not started yet.

        Nothing in memory says what an earlier process saw: a duplicate it found in dry-run (a "would"
        decides nothing) and that is still queued can still be stopped, now that the mode writes.
        Groups whose duplicates all started are left out: they were too late before this start, and
        judging them would alert again about every old group on each restart."""
        runs = dag_runs.unfinished_asset_runs(
            conn, self.db.tables, max(0, upto - resume.CATCH_UP_LIMIT), upto, resume.CATCH_UP_LIMIT
        )
        findings = [f for f in (self._rejudger.judge(conn, runs, now) if runs else []) if self._stoppable(f)]
        if findings:
            log.info("swept_not_started_groups", groups=len(findings), runs=len(runs), upto_id=upto)
        return findings

    def _stoppable(self, finding: Finding) -> bool:
        """Whether a duplicate of ``finding`` may still be stopped: not stopped before (nor created
        skipped by the guard), not started (unless ``remediate_started``); the planner decides the rest."""
        for run in finding.duplicates:
            progress = finding.progress.get(run.id, NO_PROGRESS)
            if run.id in finding.prior.stopped or progress.guarded:
                continue
            if self.config.remediate_started or not progress.any_started:
                return True
        return False

    def summary(self) -> dict[str, object]:
        tracker = self.detector.tracker if self.detector else None
        return {"watermark": tracker.high if tracker else None, "open_gaps": len(tracker.gaps) if tracker else 0}

    def close(self) -> None:
        self._drop_poll_connection()

    def _poll_connection(self) -> Connection:
        """One long-lived autocommit connection for polls: no pool checkout, ping or ROLLBACK per poll
        (that overhead was most of an idle poll's cost), with the idle probe prepared on it
        (``detector.metadb.prepared``). Dropped on any error and reopened next pass."""
        if self._conn is None:
            try:
                self._conn = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError as exc:
                raise DatabaseError(describe_error(exc, self.db.engine.url)) from None
            # A failure here fails the pass, which drops the connection (``failed``).
            unreadable = queues_unreadable(self._conn, self.db.tables)
            if unreadable != self.queues_unreadable:
                self.queues_unreadable = unreadable
                if unreadable is not None:
                    log.warning("idle_probe", queues=False, detail=unreadable)
            self._probe, prepared = top_run_id_probe(self._conn, self.db.tables, queues=unreadable is None)
            if prepared != self.probe_prepared:
                self.probe_prepared = prepared
                reason = "pinned session" if prepared else "transaction or statement pooling, or SQLite: sent as text"
                log.info("idle_probe", prepared=prepared, detail=reason)
        return self._conn

    def _drop_poll_connection(self) -> None:
        """Only the polling thread calls this (a pass that failed, or the loop's end)."""
        conn, self._conn, self._probe = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.invalidate()
                conn.close()

    def _report_gap(self, gap: resume.CoverageGap) -> None:
        """Runs no term will judge are never dropped silently."""
        self.coverage_gap = gap.reason()
        self.metrics.coverage_gaps.inc()
        log.warning(
            "coverage_gap",
            first_id=gap.first_id,
            last_id=gap.last_id,
            queued_from=None if gap.queued_from is None else gap.queued_from.isoformat(),
            queued_to=None if gap.queued_to is None else gap.queued_to.isoformat(),
            detail=gap.why,
        )

    def _report_late(self, late: tuple[tuple[int, float], ...], abandoned: int) -> None:
        """A run that committed after ``gap_grace`` is never dropped silently."""
        if late:
            self.metrics.late_runs.inc(len(late))
            log.warning(
                "late_run_found",
                run_ids=[i for i, _ in late],
                seconds_late=[round(s, 1) for _, s in late],
                detail="committed after --gap-grace; found by the re-scan and judged now",
            )
        if abandoned:
            self.metrics.gaps_abandoned.inc(abandoned)
            log.info("gap_abandoned", ids=abandoned, detail="never committed within the re-scan horizon")


def _safe_watermark(tracker: NewRowTracker) -> int:
    """Highest id below which every run has been examined (open and late gaps may still commit)."""
    lowest = tracker.lowest_unseen()
    return tracker.high if lowest is None else lowest - 1

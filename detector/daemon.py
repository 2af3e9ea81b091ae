"""``dupguard run``: the loop beside every scheduler. Polls for new runs, and on the leader hands each
finding to the ledger, the remediator and the alerter.

Threads: the detection loop (this module, a plain loop: at a 10 ms cadence a job scheduler's
per-run overhead would cost more than the poll itself); APScheduler runs the slow periodic jobs (leader
heartbeat, summary line) with ``max_instances=1, coalesce=True``; the health server; the alerter's
sender. A failing pass never ends the loop: it is retried with back-off and the tracker is rewound so
no run is lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from detector import logs, queries
from detector.config import Config
from detector.db import AirflowDb, connect, describe_error
from detector.detect import DagFilter
from detector.errors import DatabaseError, DupguardError
from detector.incremental import IncrementalDetector, NewRowTracker
from detector.metrics import Metrics
from detector.model import Finding
from detector.plan import Action, Mode, Outcome, plan
from detector.ports import Alerter, AlertEvent, AlertKind, Ledger, RemediationResult, Remediator, Result
from detector.split_watch import SplitWatch

log = logs.get("dupguard.daemon")
MAX_BACKOFF = 5.0
EXIT_DB = 3  # as ``dupguard scan``: the database failed
REMEDIATION_WORKERS = 4
STARTUP_SCAN_LIMIT = 100_000  # ids below max(id) searched for the start of the look-back


class Leadership(Protocol):
    def ensure(self, now: datetime) -> bool: ...
    def is_leader(self, now: datetime) -> bool: ...
    def release(self) -> None: ...


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Parts:
    """Everything the daemon talks to, built by the entrypoint and injected (tests pass their own)."""

    db: AirflowDb
    leadership: Leadership
    ledger: Ledger
    remediator: Remediator
    alerter: Alerter
    metrics: Metrics
    splits: SplitWatch | None = None  # Airflow 3.2+: split partition keys (detector.split_watch)


@dataclass
class _Tally:
    """Counts since the last summary line."""

    polls: int = 0
    new_runs: int = 0
    findings: int = 0
    errors: int = 0
    poll_seconds_max: float = 0.0
    poll_seconds_sum: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self) -> dict[str, float]:
        with self.lock:
            out = {
                "polls": self.polls,
                "new_runs": self.new_runs,
                "findings": self.findings,
                "errors": self.errors,
                "poll_ms_avg": round(1000 * self.poll_seconds_sum / self.polls, 3) if self.polls else 0.0,
                "poll_ms_max": round(1000 * self.poll_seconds_max, 3),
            }
            self.polls = self.new_runs = self.findings = self.errors = 0
            self.poll_seconds_max = self.poll_seconds_sum = 0.0
            return out


class Daemon:
    def __init__(self, config: Config, parts: Parts, clock: Callable[[], datetime] = utcnow) -> None:
        self.config = config
        self.parts = parts
        self.clock = clock
        self.stop = threading.Event()
        self.detector: IncrementalDetector | None = None
        self.db_ok = False
        self.last_tick = time.monotonic()
        self._consecutive_failures = 0
        self._conn: Connection | None = None
        self._last_batch_full = False
        # Bounded by the engine's pool (2 + 2 overflow): each remediation re-reads the run first.
        self._pool = ThreadPoolExecutor(max_workers=REMEDIATION_WORKERS, thread_name_prefix="dupguard-remediate")
        self._tally = _Tally()
        self._mode = Mode(config.remediation)
        self._filter = DagFilter(config.dags, config.exclude_dags)
        parts.metrics.set_build(parts.db.info.family.value)

    # --- health -------------------------------------------------------------------------------

    def live(self) -> bool:
        allowed = max(10.0, 50 * self.config.poll_interval.total_seconds())
        return time.monotonic() - self.last_tick < allowed

    def ready(self) -> bool:
        return self.db_ok

    # --- lifecycle ----------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Run until ``stop`` is set (or one pass with ``once``). Returns the exit code."""
        self.check_leader()
        if once:
            return self._run_once()
        scheduler = BackgroundScheduler(timezone=UTC)
        scheduler.add_job(self.check_leader, "interval", seconds=self.config.leader_check_interval.total_seconds(),
                          max_instances=1, coalesce=True, id="leader")  # fmt: skip
        scheduler.add_job(self.log_summary, "interval", seconds=self.config.summary_interval.total_seconds(),
                          max_instances=1, coalesce=True, id="summary")  # fmt: skip
        if self.parts.splits is not None:
            scheduler.add_job(self.check_splits, "interval", seconds=self.config.split_poll_interval.total_seconds(),
                              max_instances=1, coalesce=True, id="splits")  # fmt: skip
        scheduler.start()
        try:
            self._loop()
        finally:
            scheduler.shutdown(wait=False)
            self._drop_poll_connection()
        return 0

    def _run_once(self) -> int:
        if not self.parts.leadership.is_leader(self.clock()):
            log.info("not_leader", detail="another replica holds the leader lock; nothing done")
            return 0
        try:
            while self.poll_pass():
                if not self._last_batch_full:
                    return 0 if self.check_splits() else EXIT_DB
            return EXIT_DB
        finally:
            self._drop_poll_connection()

    def _loop(self) -> None:
        interval = self.config.poll_interval.total_seconds()
        while not self.stop.is_set():
            self.last_tick = time.monotonic()
            if self.parts.leadership.is_leader(self.clock()):
                ok = self.poll_pass()
                if ok and self._last_batch_full:
                    continue
                wait = interval if ok else min(MAX_BACKOFF, interval * 2 ** min(self._consecutive_failures, 12))
            else:
                if self.detector is not None:
                    log.info("standing_by", reason="leader lock lost")
                self.detector = None  # a new term starts from the ledger watermark / look-back
                wait = max(interval, 0.1)
            self.stop.wait(wait)

    def shutdown(self, timeout: float = 3.0) -> None:
        """Release the lock and drain alerts; bounded so SIGTERM finishes inside the grace period."""
        self.stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.parts.alerter.close(timeout)
        self.parts.remediator.close()
        self.parts.leadership.release()
        self.parts.metrics.leader.set(0)

    # --- periodic jobs ------------------------------------------------------------------------

    def check_leader(self) -> None:
        now = self.clock()
        was = self.parts.leadership.is_leader(now)
        leader = self.parts.leadership.ensure(now)
        self.parts.metrics.leader.set(1 if leader else 0)
        if leader != was:
            log.info("leadership_changed", leader=leader)
        self._ping_db()
        if leader:
            self.parts.remediator.prepare()

    def _ping_db(self) -> None:
        try:
            with connect(self.parts.db.engine) as conn:
                queries.ping(conn)
            ok = True
        except DupguardError:
            ok = False
        if ok != self.db_ok:
            log.info("database_reachable" if ok else "database_unreachable")
        self.db_ok = ok
        self.parts.metrics.db_up.set(1 if ok else 0)

    def check_splits(self) -> bool:
        """One check for split partition keys, on the leader only; False (logged) if it failed."""
        if self.parts.splits is None or not self.parts.leadership.is_leader(self.clock()):
            return True
        try:
            self.parts.splits.check(self.clock())
        except (DupguardError, SQLAlchemyError) as exc:
            log.warning("split_check_failed", error=str(exc) or type(exc).__name__)
            return False
        except Exception:  # a bug here must not end the sidecar
            log.exception("split_check_crashed")
            return False
        return True

    def log_summary(self) -> None:
        tracker = self.detector.tracker if self.detector else None
        log.info(
            "summary",
            leader=self.parts.leadership.is_leader(self.clock()),
            db_up=self.db_ok,
            watermark=tracker.high if tracker else None,
            open_gaps=len(tracker.gaps) if tracker else 0,
            **self._tally.take(),
        )

    # --- one pass -----------------------------------------------------------------------------

    def poll_pass(self) -> bool:
        """One poll and the handling of its findings. False (and nothing lost) if it failed."""
        now = self.clock()
        started = time.perf_counter()
        tracker_state: tuple[int, dict[int, datetime]] | None = None
        try:
            detector = self.detector or self._start_term(now)
            tracker_state = (detector.tracker.high, dict(detector.tracker.gaps))
            result = detector.poll(self._poll_connection(), now)
            if result.findings:
                self.handle(result.findings, now)
            if result.new_runs and self.parts.ledger.durable:
                self.parts.ledger.save_watermark(_safe_watermark(detector.tracker))
        except (DupguardError, SQLAlchemyError) as exc:
            return self._failed(exc, tracker_state)
        except Exception as exc:  # a bug in one pass must not end the sidecar
            log.exception("poll_crashed")
            return self._failed(exc, tracker_state)
        elapsed = time.perf_counter() - started
        self._record_success(elapsed, len(result.new_runs), len(result.findings))
        self._last_batch_full = result.batch_full
        return True

    def _poll_connection(self) -> Connection:
        """One long-lived autocommit connection for polls: no pool checkout, ping or ROLLBACK per poll
        (that overhead was most of an idle poll's cost). Dropped on any error and reopened next pass."""
        if self._conn is None:
            try:
                self._conn = self.parts.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            except SQLAlchemyError as exc:
                raise DatabaseError(describe_error(exc, self.parts.db.engine.url)) from None
        return self._conn

    def _drop_poll_connection(self) -> None:
        """Only the polling thread calls this (a pass that failed, or the loop's end)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.invalidate()
                conn.close()

    def _start_term(self, now: datetime) -> IncrementalDetector:
        """Where a new leader term starts reading: the durable watermark, else the look-back."""
        t = self.parts.db.tables
        start = self.parts.ledger.watermark() if self.parts.ledger.durable else None
        if start is None:
            with connect(self.parts.db.engine) as conn:
                top = queries.max_run_id(conn, t)
                first = queries.first_run_id_since(
                    conn, t, now - self.config.startup_lookback, max(0, top - STARTUP_SCAN_LIMIT)
                )
            start = top if first is None else first - 1
        self.detector = IncrementalDetector(
            tables=t,
            tracker=NewRowTracker(high=start, grace=self.config.gap_grace),
            dag_filter=self._filter,
            suspect_window=self.config.suspect_window,
        )
        log.info("watching", from_id=start, durable_ledger=self.parts.ledger.durable)
        return self.detector

    def _failed(self, exc: BaseException, tracker_state: tuple[int, dict[int, datetime]] | None) -> bool:
        self._drop_poll_connection()
        if self.detector is not None and tracker_state is not None:
            self.detector.tracker.high, self.detector.tracker.gaps = tracker_state[0], tracker_state[1]
        self._consecutive_failures += 1
        self.parts.metrics.poll_errors.inc()
        with self._tally.lock:
            self._tally.errors += 1
        n = self._consecutive_failures
        if n == 1 or n % 100 == 0:
            log.warning("poll_failed", error=str(exc) or type(exc).__name__, consecutive=n)
        return False

    def _record_success(self, elapsed: float, new_runs: int, findings: int) -> None:
        if self._consecutive_failures:
            log.info("poll_recovered", after_failures=self._consecutive_failures)
        self._consecutive_failures = 0
        m = self.parts.metrics
        m.poll_duration.observe(elapsed)
        m.last_successful_poll.set(time.time())
        with self._tally.lock:
            self._tally.polls += 1
            self._tally.new_runs += new_runs
            self._tally.findings += findings
            self._tally.poll_seconds_sum += elapsed
            self._tally.poll_seconds_max = max(self._tally.poll_seconds_max, elapsed)

    # --- acting on a finding --------------------------------------------------------------------

    def handle(self, findings: list[Finding], now: datetime) -> None:
        """Remediate first (it races the duplicates' tasks), all at once, then log and queue alerts.

        One asset event duplicates every consumer DAG in the same race, and an API remediation takes
        ~100 ms: handled one after another, the last groups miss their window (docs/e2e.md). The
        claims are taken first, so concurrency never lets two workers act on one run.
        """
        ledger = self.parts.ledger
        claimed: list[tuple[Finding, list[Action], list[Action], bool]] = []
        for finding in findings:
            actions = plan([finding], self._mode, now=now, remediate_started=self.config.remediate_started)
            # Unconfirmed/disabled actions claim nothing: a later verdict on the same group may still act.
            decided = [a for a in actions if a.outcome not in (Outcome.NOT_CONFIRMED, Outcome.DISABLED)]
            won = ledger.claim_all(finding.key, ["detected", *(f"action:{a.run.run_id}" for a in decided)])
            todo = [a for a in decided if f"action:{a.run.run_id}" in won]
            claimed.append((finding, actions, todo, "detected" in won))
        work = [action for _, _, todo, _ in claimed for action in todo]
        run = self._pool.map if len(work) > 1 else map
        results = iter(list(run(self._execute, work)))  # in the order of ``work``
        for finding, actions, todo, first in claimed:
            self._report(finding, actions, [next(results) for _ in todo], first, now)

    def _report(
        self, finding: Finding, actions: list[Action], results: list[RemediationResult], first: bool, now: datetime
    ) -> None:
        m = self.parts.metrics
        if first:
            m.groups_detected.labels(kind=finding.kind.value, confidence=finding.confidence.value).inc()
            m.groups_by_dag.labels(dag_id=finding.dag_id).inc()
            for run in finding.duplicates:
                if run.queued_at is not None:
                    m.detection_latency.observe(max(0.0, (now - run.queued_at).total_seconds()))
        elif not results:
            return
        event = AlertEvent(
            kind=AlertKind.DETECTED if first else AlertKind.OUTCOME,
            finding=finding,
            detected_at=now,
            cluster=self.config.cluster_name,
            mode=self._mode.value,
            actions=tuple(actions),
            results=tuple(results),
        )
        self.parts.alerter.notify(event)

    def _execute(self, action: Action) -> RemediationResult:
        if action.outcome in (Outcome.REMEDIATE, Outcome.WOULD_REMEDIATE):
            return self.parts.remediator.execute(action)
        if action.outcome is Outcome.TOO_LATE:
            return RemediationResult(action=action, result=Result.TOO_LATE, detail="its tasks had started")
        return RemediationResult(
            action=action, result=Result.ALREADY, detail="prevented: created with every task skipped (guard)"
        )


def _safe_watermark(tracker: NewRowTracker) -> int:
    """Highest id below which every run has been examined (open gaps may still commit)."""
    return min(tracker.gaps) - 1 if tracker.gaps else tracker.high

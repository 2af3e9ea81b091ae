"""``dupguard run``: the loop beside every scheduler. Polls for new runs, and on the leader hands each
poll's findings to ``detector.app.respond`` (the ledger's claims, the alerts, the remediation workers).
This module keeps the loop, leadership and health.

Threads: the detection loop (this module, a plain loop: at a few milliseconds' cadence a job scheduler's
per-run overhead would cost more than the poll itself; fast only while a race is possible,
``detector.core.pace``); the remediation workers
(``detector.actions.remediation.dispatch``: the loop only queues, so a slow or hanging API never delays
detection); APScheduler runs the slow periodic jobs (source check, summary line, checks) with
``max_instances=1, coalesce=True``, and the leader heartbeat on a scheduler and thread of its own; the
health server; the alerter's sender. A failing pass never ends the loop: it is retried with back-off
and the tracker is rewound so no run is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import SQLAlchemyError

from detector import logs
from detector.app.leader import LockProblem
from detector.app.ledger import DbLedger
from detector.app.ledger_fault import MISSING, Fault
from detector.app.preparer import Preparer
from detector.app.respond import Responder
from detector.app.status import StatusBoard, evaluate
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.core.fence import Fence
from detector.core.pace import Pace
from detector.core.ports import Alerter, Ledger, Remediator, RunSource
from detector.errors import DupguardError
from detector.metrics import Metrics

log = logs.get("dupguard.daemon")
MAX_BACKOFF = 5.0
EXIT_DB = 3  # as ``dupguard scan``: the database failed
# ``run --once`` on a standby: another replica leads, so nothing was checked (not "nothing found").
EXIT_NOT_LEADER = 4
ONCE_DRAIN_SECONDS = 60.0  # ``run --once`` waits this long for its remediations
LOCK_RELEASE_WAIT = 2.0  # seconds shutdown waits for a running leader check before releasing anyway
RELEASE_RESERVE = 0.5  # seconds of shutdown's deadline kept for releasing the leader lock
# The idle loop's pauses up to this long sleep instead of waiting on ``stop``: a timed Event.wait (a
# Condition, a lock allocated per call, a timed futex) cost ~25 µs more CPU than time.sleep per pause,
# a quarter of a point of a core at a 10 ms poll (benchmarks/results/measurements.md, "The idle loop's CPU").
# ``stop`` is then seen at the next pass, at most this much later.
SHORT_PAUSE = 0.05
LEDGER_PROBE_INTERVAL = 1.0  # seconds between probes of a broken ledger (a repair, or seeing it mended)


class Leadership(Protocol):
    """The leader lock (``detector.app.leader``: ``AdvisoryLock``, or ``AlwaysLeader`` for one replica)."""

    @property
    def problem(self) -> LockProblem | None: ...  # why this replica can neither lead nor trust another leader

    def ensure(self, now: datetime) -> bool: ...
    def is_leader(self, now: datetime) -> bool: ...
    def release(self) -> None: ...

    def fence(self) -> Fence | None:
        """Permission to write now (``detector.core.fence``; ``UNFENCED`` for the only replica); None: not now."""
        ...

    def waiting(self) -> float | None:
        """Seconds this new leader still waits before its first write (None: not waiting)."""
        ...


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class Parts:
    """Everything the daemon talks to, built by the entrypoint and injected (tests pass their own)."""

    source: RunSource  # the metadata database (sources.database) or the REST API (sources.api)
    leadership: Leadership
    ledger: Ledger
    remediator: Remediator
    alerter: Alerter
    metrics: Metrics
    checks: CheckRunner | None = None  # the periodic checks (detector.checks): split partitions, ...


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
    def __init__(
        self,
        config: Config,
        parts: Parts,
        clock: Callable[[], datetime] = utcnow,
        *,
        once: bool = False,
        dispatch_options: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.parts = parts
        self.clock = clock
        self.stop = threading.Event()
        self.db_ok = False  # the source (database or API) answered the last ping
        self.last_tick = time.monotonic()
        self._last_good_poll = -1.0  # monotonic time of the last successful poll pass
        self._last_good_poll_unix = 0.0  # the same as Unix time, for its gauge (read at scrape time)
        self._last_check = -1.0  # monotonic time the last source check started
        self._standing_by = False  # the last heartbeat found another replica leading, as did the one before
        self._leadership_turn = threading.Lock()  # check_leader vs shutdown's release
        self._consecutive_failures = 0
        self._last_batch_full = False
        self._stirred: bool | None = None  # what the last successful poll said of the asset queues
        self._asset_runs = 0  # new asset-triggered runs the last successful poll found
        self.pace = Pace(
            fast=config.poll_interval.total_seconds(),
            rest=config.poll_rest_interval.total_seconds(),
            hold=config.poll_hold.total_seconds(),
        )
        self._tally = _Tally()
        self._responder = Responder(
            config,
            ledger=parts.ledger,
            remediator=parts.remediator,
            alerter=parts.alerter,
            metrics=parts.metrics,
            rejudge=parts.source.rejudge,
            may_act=lambda: parts.leadership.fence() is not None,
            clock=clock,
            retry=not once,
            dispatch_options=dispatch_options,
        )
        self._db_error: str | None = None
        # The durable ledger's faults (detector.app.ledger_fault): shown in health, probed and repaired here.
        self._ledger = parts.ledger if isinstance(parts.ledger, DbLedger) else None
        if self._ledger is not None:
            self._ledger.faults.attach(parts.metrics)
        self._next_probe = 0.0
        self._repair_tried: Fault | None = None  # a refused repair is tried (and logged) once per fault
        self._pickup_due = False  # the ledger could not list the pending remediations: again once it can
        self._poll_error: str | None = None
        self._preparer = Preparer(parts.remediator, self.refresh_status)  # a hanging API never holds the heartbeat
        self.status = StatusBoard(parts.metrics)
        parts.metrics.set_build(parts.source.family)
        # Read at scrape time: a stale heartbeat shows as 0 even while the heartbeat job is blocked.
        parts.metrics.leader.set_function(lambda: 1.0 if parts.leadership.is_leader(self.clock()) else 0.0)
        parts.metrics.leader_wait.set_function(lambda: parts.leadership.waiting() or 0.0)
        # Read at scrape time too: setting a Gauge (its lock, its checks) on every 10 ms poll cost more than the read.
        parts.metrics.last_successful_poll.set_function(lambda: self._last_good_poll_unix)

    # --- health -------------------------------------------------------------------------------

    def live(self) -> bool:
        allowed = max(10.0, 50 * self.pace.slowest)
        return time.monotonic() - self.last_tick < allowed

    def ready(self) -> tuple[bool, str]:
        """Ready = up (``detector.app.status``): leading and polling, or standing by behind a live leader.
        Alerts a channel could not deliver are named too (they do not make a replica unready)."""
        status = self.status.current
        note = self.parts.alerter.trouble()
        return status.up, f"{status.state.value}: {status.reason}" + (f"; alerts undelivered: {note}" if note else "")

    def refresh_status(self) -> None:
        self.status.update(
            evaluate(
                db_error=self._db_error if self.parts.source.name == "database" else None,
                api_error=self._db_error if self.parts.source.name == "api" else None,
                leader=self.parts.leadership.is_leader(self.clock()),
                poll_error=self._poll_error,
                lock=self.parts.leadership.problem,
                waiting=self.parts.leadership.waiting(),
                remediation=self._preparer.problem,
                ledger=None
                if self._ledger is None or self._ledger.faults.current is None
                else str(self._ledger.faults.current),
            )
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Run until ``stop`` is set (or one pass with ``once``). Returns the exit code."""
        self.check_leader()
        every = self.config.leader_check_interval.total_seconds()
        # The heartbeat, with --once too (the lease, and the fence every write needs, would end mid-drain),
        # on a scheduler and thread of its own: no other job can hold it back.
        lease = BackgroundScheduler(timezone=UTC, executors={"default": ThreadPoolExecutor(1)})
        lease.add_job(self.renew_lease, "interval", seconds=every, max_instances=1, coalesce=True, id="lease")
        lease.start()
        scheduler = BackgroundScheduler(timezone=UTC)
        scheduler.add_job(self.check_source, "interval", seconds=every, max_instances=1, coalesce=True, id="source")
        try:
            if once:
                scheduler.start()
                try:
                    return self._run_once()
                finally:
                    scheduler.shutdown(wait=False)
            return self._run_loop(scheduler)
        finally:
            lease.shutdown(wait=False)

    def _run_loop(self, scheduler: BackgroundScheduler) -> int:
        scheduler.add_job(self.log_summary, "interval", seconds=self.config.summary_interval.total_seconds(),
                          max_instances=1, coalesce=True, id="summary")  # fmt: skip
        for kind, check in (self.parts.checks.checks if self.parts.checks else {}).items():
            scheduler.add_job(self.run_check, "interval", args=[kind], seconds=check.interval().total_seconds(),
                              max_instances=1, coalesce=True, id=f"check:{kind}")  # fmt: skip
        scheduler.start()
        try:
            self._loop()
        finally:
            scheduler.shutdown(wait=False)
            self.parts.source.close()
        return 0

    def _run_once(self) -> int:
        if not self.parts.leadership.is_leader(self.clock()):
            problem = self.parts.leadership.problem
            if problem is not None:  # e.g. lock_on_standby: say why, not "another replica"
                log.warning("not_leader", problem=problem.code, detail=f"{problem.reason}; nothing checked (exit 4)")
            else:
                log.warning("not_leader", detail="another replica holds the leader lock; nothing checked (exit 4)")
            return EXIT_NOT_LEADER
        try:
            while self.poll_pass():
                if not self._last_batch_full:
                    if not self._responder.drain(ONCE_DRAIN_SECONDS):
                        log.warning("remediations_unfinished", waited_seconds=ONCE_DRAIN_SECONDS)
                    return 0 if self.run_checks() else EXIT_DB
            return EXIT_DB
        finally:
            self.parts.source.close()

    def _loop(self) -> None:
        interval = self.config.poll_interval.total_seconds()
        while not self.stop.is_set():
            self.last_tick = time.monotonic()
            if self.parts.leadership.is_leader(self.clock()):
                ok = self.poll_pass()
                if ok and self._last_batch_full:
                    continue
                if not ok:
                    wait = min(MAX_BACKOFF, interval * 2 ** min(self._consecutive_failures, 12))
                elif self._stirred is None:  # a source without a queue fingerprint (the REST API)
                    wait = interval
                else:
                    wait = self.pace.wait(time.monotonic(), self._stirred, self._asset_runs > 0)
            else:
                if self.parts.source.watching:
                    log.info("standing_by", reason="leader lock lost")
                    self.refresh_status()
                self.parts.source.end()  # the next term resumes where this one stopped (RunSource.start)
                wait = max(interval, 0.1)
            self._pause(wait)

    def _pause(self, seconds: float) -> None:
        """Until the next pass: a short pause sleeps (``SHORT_PAUSE``), a longer one (a back-off, a
        standby's wait, a long poll interval) ends as soon as ``stop`` is set."""
        if seconds <= SHORT_PAUSE:
            time.sleep(seconds)
        else:
            self.stop.wait(seconds)

    def shutdown(self, timeout: float = 3.0) -> None:
        """Release the lock and drain alerts; bounded so SIGTERM finishes inside the grace period: the
        remediation workers, the alerts and the wait for a running leader check share ``timeout`` (one
        deadline, not one each), less ``RELEASE_RESERVE`` kept for the release itself."""
        ends = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, ends - RELEASE_RESERVE - time.monotonic())

        self.stop.set()
        self._preparer.close()
        self._responder.close(timeout=min(left(), 2.0))
        self.parts.alerter.close(left())
        self.parts.remediator.close()
        # A leader check already running (scheduler thread) finishes first, and none starts after the
        # release: a stopping replica must not take the lock again and hold up the standby's takeover.
        got = self._leadership_turn.acquire(timeout=min(LOCK_RELEASE_WAIT, max(0.1, left())))
        try:
            self.parts.leadership.release()
        finally:
            if got:
                self._leadership_turn.release()
        self.parts.metrics.leader.set(0)

    # --- periodic jobs ------------------------------------------------------------------------

    def check_leader(self) -> None:
        """The leader heartbeat, then the source-up check (the scheduler runs them as two jobs)."""
        self.renew_lease()
        self.check_source()

    def renew_lease(self) -> None:
        """The leader heartbeat: one statement on the lock's own connection, nothing else. Its own job
        on a scheduler of its own: a storm's remediations holding every pooled connection (the source's
        ping waits for one) or a slow periodic check must never make the lease lapse on a lone replica."""
        with self._leadership_turn:
            if self.stop.is_set():
                return  # stopping: the lock is (being) released, never taken again
            now = self.clock()
            was = self.parts.leadership.is_leader(now)
            leader = self.parts.leadership.ensure(now)
            self.parts.metrics.leader.set(1 if leader else 0)
            self._standing_by = not was and not leader
            if leader != was:
                log.info("leadership_changed", leader=leader)
                self.refresh_status()

    def check_source(self) -> None:
        """The source-up check and the health state. On a leader whose polls succeeded since the last
        check, those polls are the check: no ping is sent (for the database a pool checkout, its
        pre-ping, the ping and a ROLLBACK). Otherwise (standing by, or no successful poll lately) the
        source is pinged."""
        if self.stop.is_set():
            return
        started = time.monotonic()
        leader = self.parts.leadership.is_leader(self.clock())
        if leader and self._last_good_poll > self._last_check:
            self._source_reached(None)
        else:
            self._source_reached(self.parts.source.ping())
        self._last_check = started
        if self._standing_by and not leader:  # standing by: what a live leader elsewhere judges, no term of ours
            live = self._db_error is None and self.parts.leadership.problem is None
            self.parts.source.stood_by(live)
        self.status.note = self.parts.source.coverage_gap
        self.refresh_status()
        if leader:
            self._preparer.request()  # never waits here: a hanging API must not hold the heartbeat

    def _source_reached(self, error: str | None) -> None:
        self._db_error = error
        ok = self._db_error is None
        if ok != self.db_ok:
            what = self.parts.source.name if self.parts.source.name == "database" else "airflow_api"
            log.info(f"{what}_reachable" if ok else f"{what}_unreachable")
        self.db_ok = ok
        self.parts.metrics.db_up.set(1 if ok else 0)

    def run_check(self, kind: str) -> bool:
        """One run of one periodic check, on the leader only; False (logged, counted) if it failed."""
        if self.parts.checks is None or not self.parts.leadership.is_leader(self.clock()):
            return True
        return self.parts.checks.run_reported(kind, self.clock())

    def run_checks(self) -> bool:
        """Every periodic check once (``run --once``); False if any failed."""
        kinds = list(self.parts.checks.checks) if self.parts.checks else []
        return all([self.run_check(kind) for kind in kinds])  # a list: every check runs, even after a failure

    def log_summary(self) -> None:
        log.info(
            "summary",
            leader=self.parts.leadership.is_leader(self.clock()),
            db_up=self.db_ok,
            **self.parts.source.summary(),
            **self._tally.take(),
        )

    # --- one pass -----------------------------------------------------------------------------

    def poll_pass(self) -> bool:
        """One poll and the handling of its findings. False (and nothing lost) if it failed."""
        now = self.clock()
        started = time.perf_counter()
        source = self.parts.source
        try:
            self._tend_ledger()
            if not source.watching:
                source.start(now)
                self._pickup_due = not self._responder.pick_up_pending()
            self._responder.resubmit()  # a storm's deferred remediations, as the queue drains
            result = source.poll(now)
            if result.findings:
                self._responder.handle(result.findings, now, result.ledger)
            source.commit()  # after the claims: a restart never skips a run that was not handled
        except (DupguardError, SQLAlchemyError) as exc:
            return self._failed(exc)
        except Exception as exc:  # a bug in one pass must not end the sidecar
            log.exception("poll_crashed")
            return self._failed(exc)
        elapsed = time.perf_counter() - started
        self._record_success(elapsed, result.new_runs, len(result.findings))
        self._last_batch_full = result.more
        self._stirred = result.stirred
        self._asset_runs = result.asset_runs
        return True

    def _tend_ledger(self) -> None:
        """While the ledger is broken: probe it now and then, re-create what is missing (the role may
        not: the fault names ``dupguard init-db``), and clear the fault once it records again."""
        ledger = self._ledger
        if ledger is None or ledger.faults.current is None or time.monotonic() < self._next_probe:
            return
        self._next_probe = time.monotonic() + LEDGER_PROBE_INTERVAL
        fault = ledger.probe()
        repaired = False
        if fault is not None and fault.kind == MISSING and fault != self._repair_tried:
            self._repair_tried = fault
            repaired = ledger.repair()
        if repaired:
            fault = ledger.probe()
        if fault is None:
            self._repair_tried = None
            ledger.faults.clear(repaired=repaired)
            if self._pickup_due:
                self._pickup_due = not self._responder.pick_up_pending()
        else:
            ledger.faults.report(fault)
        self.refresh_status()

    def _failed(self, exc: BaseException) -> bool:
        error = self.parts.source.failed(exc)
        self._consecutive_failures += 1
        self.parts.metrics.poll_errors.inc()
        with self._tally.lock:
            self._tally.errors += 1
        n = self._consecutive_failures
        if n == 1 or n % 100 == 0:
            log.warning("poll_failed", error=error, consecutive=n)
        if error != self._poll_error:  # the latest cause, not the first of the streak (a blip, then a full disk)
            self._poll_error = error
            self.refresh_status()
        return False

    def _record_success(self, elapsed: float, new_runs: int, findings: int) -> None:
        if self._consecutive_failures:
            log.info("poll_recovered", after_failures=self._consecutive_failures)
        self._consecutive_failures = 0
        if self._poll_error is not None:
            self._poll_error = None
            self.refresh_status()
        self._last_good_poll = time.monotonic()
        m = self.parts.metrics
        m.poll_duration.observe(elapsed)
        self._last_good_poll_unix = time.time()
        with self._tally.lock:
            self._tally.polls += 1
            self._tally.new_runs += new_runs
            self._tally.findings += findings
            self._tally.poll_seconds_sum += elapsed
            self._tally.poll_seconds_max = max(self._tally.poll_seconds_max, elapsed)

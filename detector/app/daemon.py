"""``dupguard run``: the loop beside every scheduler. Polls for new runs, and on the leader hands each
finding to the ledger, the remediation workers and the alerter.

Threads: the detection loop (this module, a plain loop: at a 10 ms cadence a job scheduler's
per-run overhead would cost more than the poll itself); the remediation workers
(``detector.actions.remediation.dispatch``: the loop only queues, so a slow or hanging API never delays
detection); APScheduler runs the slow periodic jobs (leader heartbeat, summary line) with
``max_instances=1, coalesce=True``; the health server; the alerter's sender. A failing pass never
ends the loop: it is retried with back-off and the tracker is rewound so no run is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy.exc import SQLAlchemyError

from detector import logs
from detector.actions.remediation.dispatch import Job, RemediationDispatcher
from detector.actions.remediation.guarded import passive_result
from detector.app.leader import LockProblem
from detector.app.preparer import Preparer
from detector.app.status import StatusBoard, evaluate
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.core.fence import UNFENCED, Fence
from detector.core.model import Finding
from detector.core.plan import UNDECIDED, Action, Mode, plan
from detector.core.ports import (
    Alerter,
    AlertEvent,
    AlertKind,
    Ledger,
    Pending,
    RemediationResult,
    Remediator,
    Result,
    RunSource,
)
from detector.errors import DupguardError
from detector.metrics import Metrics

log = logs.get("dupguard.daemon")
MAX_BACKOFF = 5.0
EXIT_DB = 3  # as ``dupguard scan``: the database failed
ONCE_DRAIN_SECONDS = 60.0  # ``run --once`` waits this long for its remediations
LOCK_RELEASE_WAIT = 2.0  # seconds shutdown waits for a running leader check before releasing anyway
# The idle loop's pauses up to this long sleep instead of waiting on ``stop``: a timed Event.wait (a
# Condition, a lock allocated per call, a timed futex) cost ~25 µs more CPU than time.sleep per pause,
# a quarter of a point of a core at a 10 ms poll (docs/benchmarks.md, "The idle loop's CPU").
# ``stop`` is then seen at the next pass, at most this much later.
SHORT_PAUSE = 0.05


class Leadership(Protocol):
    @property
    def problem(self) -> LockProblem | None: ...  # why this replica can neither lead nor trust another leader

    def ensure(self, now: datetime) -> bool: ...
    def is_leader(self, now: datetime) -> bool: ...
    def release(self) -> None: ...

    # Optional (simple fakes leave them out: a leader then writes unfenced, never waits):
    # fence() -> Fence | None: permission to write now (detector.app.leader.Fence); waiting() -> float | None.


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
    checks: CheckRunner | None = None  # the periodic checks (detector.app.checks): split partitions, ...


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


@dataclass
class _GroupOutcome:
    """The remediation results of one group so far; its OUTCOME alert goes out once every action has
    a first result, and again whenever a retried action reaches its final one."""

    finding: Finding
    actions: list[Action]
    latest: dict[str, RemediationResult] = field(default_factory=dict)  # by run_id
    open: set[str] = field(default_factory=set)  # run_ids without a final result
    unseen: set[str] = field(default_factory=set)  # run_ids without any result yet
    announced: bool = False


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
        self._last_check = -1.0  # monotonic time the last leader check started
        self._leadership_turn = threading.Lock()  # check_leader vs shutdown's release
        self._consecutive_failures = 0
        self._last_batch_full = False
        self._tally = _Tally()
        self._mode = Mode(config.remediation)
        self._outcomes: dict[str, _GroupOutcome] = {}
        self._outcomes_lock = threading.Lock()
        # groups alerted while the ledger could not record them: not alerted again once it can
        self._unrecorded: dict[str, None] = {}
        # Workers: bounded by the engine's pool (2 + 2 overflow), as each remediation re-reads the run.
        self._dispatcher = RemediationDispatcher(
            parts.remediator,
            recheck=self._recheck,
            on_result=self._on_result,
            may_act=lambda: self.fence() is not None,
            metrics=parts.metrics,
            retry=not once,
            **(dispatch_options or {}),
        )
        self._db_error: str | None = None
        self._poll_error: str | None = None
        self._preparer = Preparer(parts.remediator, self.refresh_status)  # off the heartbeat (issue 22 §6)
        self.status = StatusBoard(parts.metrics)
        parts.metrics.set_build(parts.source.family)
        # Read at scrape time: a stale heartbeat shows as 0 even while the heartbeat job is blocked.
        parts.metrics.leader.set_function(lambda: 1.0 if parts.leadership.is_leader(self.clock()) else 0.0)
        parts.metrics.leader_wait.set_function(lambda: self.waiting() or 0.0)
        # Read at scrape time too: setting a Gauge (its lock, its checks) on every 10 ms poll cost more than the read.
        parts.metrics.last_successful_poll.set_function(lambda: self._last_good_poll_unix)

    def fence(self) -> Fence | None:
        """Permission to write now (the remediation asks before every write): the lock's fence."""
        fence = getattr(self.parts.leadership, "fence", None)
        if fence is not None:
            found: Fence | None = fence()
            return found
        return UNFENCED if self.parts.leadership.is_leader(self.clock()) else None

    def waiting(self) -> float | None:
        """Seconds this new leader still waits before its first write (None: not waiting)."""
        waiting = getattr(self.parts.leadership, "waiting", None)
        return waiting() if waiting is not None else None

    # --- health -------------------------------------------------------------------------------

    def live(self) -> bool:
        allowed = max(10.0, 50 * self.config.poll_interval.total_seconds())
        return time.monotonic() - self.last_tick < allowed

    def ready(self) -> tuple[bool, str]:
        """Ready = up (``detector.app.status``): leading and polling, or standing by behind a live leader.
        Alerts a channel could not deliver are named too (they do not make a replica unready)."""
        status = self.status.current
        trouble = getattr(self.parts.alerter, "trouble", None)  # optional for simple Alerter fakes
        note = trouble() if trouble is not None else None
        return status.up, f"{status.state.value}: {status.reason}" + (f"; alerts undelivered: {note}" if note else "")

    def refresh_status(self) -> None:
        self.status.update(
            evaluate(
                db_error=self._db_error if self.parts.source.name == "database" else None,
                api_error=self._db_error if self.parts.source.name == "api" else None,
                leader=self.parts.leadership.is_leader(self.clock()),
                poll_error=self._poll_error,
                lock=getattr(self.parts.leadership, "problem", None),  # optional for simple Leadership fakes
                waiting=self.waiting(),
                remediation=self._preparer.problem,
            )
        )

    # --- lifecycle ----------------------------------------------------------------------------

    def run(self, *, once: bool = False) -> int:
        """Run until ``stop`` is set (or one pass with ``once``). Returns the exit code."""
        self.check_leader()
        scheduler = BackgroundScheduler(timezone=UTC)
        # The heartbeat, with --once too: the lease (and the fence every write needs) would end mid-drain.
        scheduler.add_job(self.check_leader, "interval", seconds=self.config.leader_check_interval.total_seconds(),
                          max_instances=1, coalesce=True, id="leader")  # fmt: skip
        if once:
            scheduler.start()
            try:
                return self._run_once()
            finally:
                scheduler.shutdown(wait=False)
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
            problem = getattr(self.parts.leadership, "problem", None)
            if problem is not None:  # e.g. lock_on_standby: say why, not "another replica"
                log.warning("not_leader", problem=problem.code, detail=f"{problem.reason}; nothing done")
            else:
                log.info("not_leader", detail="another replica holds the leader lock; nothing done")
            return 0
        try:
            while self.poll_pass():
                if not self._last_batch_full:
                    if not self._dispatcher.drain(ONCE_DRAIN_SECONDS):
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
                wait = interval if ok else min(MAX_BACKOFF, interval * 2 ** min(self._consecutive_failures, 12))
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
        remediation workers and the alerts share ``timeout`` (one deadline, not one each)."""
        ends = time.monotonic() + timeout
        self.stop.set()
        self._preparer.close()
        self._dispatcher.close(timeout=min(timeout, 2.0))
        self.parts.alerter.close(max(0.0, ends - time.monotonic()))
        self.parts.remediator.close()
        # A leader check already running (scheduler thread) finishes first, and none starts after the
        # release: a stopping replica must not take the lock again and hold up the standby's takeover.
        got = self._leadership_turn.acquire(timeout=LOCK_RELEASE_WAIT)
        try:
            self.parts.leadership.release()
        finally:
            if got:
                self._leadership_turn.release()
        self.parts.metrics.leader.set(0)

    # --- periodic jobs ------------------------------------------------------------------------

    def check_leader(self) -> None:
        """The leader heartbeat (one statement on the lock connection) and the source-up check.

        On a leader whose polls succeeded since the last check, those polls are the source-up check:
        no ping is sent (for the database a pool checkout, its pre-ping, the ping and a ROLLBACK).
        Otherwise (standing by, or no successful poll lately) the source is pinged."""
        with self._leadership_turn:
            if self.stop.is_set():
                return  # stopping: the lock is (being) released, never taken again
            started = time.monotonic()
            now = self.clock()
            was = self.parts.leadership.is_leader(now)
            leader = self.parts.leadership.ensure(now)
            self.parts.metrics.leader.set(1 if leader else 0)
            if leader != was:
                log.info("leadership_changed", leader=leader)
            if leader and self._last_good_poll > self._last_check:
                self._source_reached(None)
            else:
                self._source_reached(self.parts.source.ping())
            self._last_check = started
            if not was and not leader:  # standing by: what a live leader elsewhere judges (issue 23 §1)
                live = self._db_error is None and getattr(self.parts.leadership, "problem", None) is None
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

    @property
    def detector(self) -> object | None:
        """The database source's incremental detector (tests wait on its tracker); None otherwise."""
        return getattr(self.parts.source, "detector", None)

    def poll_pass(self) -> bool:
        """One poll and the handling of its findings. False (and nothing lost) if it failed."""
        now = self.clock()
        started = time.perf_counter()
        source = self.parts.source
        try:
            if not source.watching:
                source.start(now)
                if self.parts.ledger.durable:
                    self._pick_up_pending()
            result = source.poll(now)
            if result.findings:
                self.handle(result.findings, now, result.ledger)
            source.commit()  # after the claims: a restart never skips a run that was not handled
        except (DupguardError, SQLAlchemyError) as exc:
            return self._failed(exc)
        except Exception as exc:  # a bug in one pass must not end the sidecar
            log.exception("poll_crashed")
            return self._failed(exc)
        elapsed = time.perf_counter() - started
        self._record_success(elapsed, result.new_runs, len(result.findings))
        self._last_batch_full = result.more
        return True

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

    # --- acting on a finding --------------------------------------------------------------------

    def handle(self, findings: list[Finding], now: datetime, ledger: Ledger | None = None) -> None:
        """Decide, record, alert, then queue the remediations; never waits for one to finish.

        Claims first (exactly one replica acts on a run), then the roles this judgement gave the
        group's runs (a decision is final: later judgements read them back, ``detector.sources.database.prior``), then
        the DETECTED alert, then the work for the remediation workers. One asset event duplicates
        every consumer DAG at once: the workers take the groups in parallel (docs/e2e.md).
        """
        ledger = ledger or self.parts.ledger  # the source's own connection when it offers one
        queued: list[Job] = []
        failed: Exception | None = None  # the ledger's failure: the poll fails (and is retried) after the alerts
        for finding in findings:
            actions = plan([finding], self._mode, now=now, remediate_started=self.config.remediate_started)
            # Undecided actions claim nothing: a later verdict on the same group may still act.
            decided = [a for a in actions if a.outcome not in UNDECIDED]
            # Every run of the group, the kept one too: a run that joins and takes the keep (it consumed
            # every event) is the news, not the old kept run that became a duplicate.
            seen = [f"detected:{r.run_id}" for r in finding.runs]
            # An undecided outcome is counted once per run and outcome, however often the group is judged.
            left = [f"{a.outcome.value}:{a.run.run_id}" for a in actions if a.outcome in UNDECIDED]
            try:
                won = ledger.claim_all(
                    finding.key, ["detected", *seen, *(f"action:{a.run.run_id}" for a in decided), *left]
                )
            except Exception as exc:  # noqa: BLE001 - raised below, once every group is alerted
                failed = failed or exc
                self._alert_unrecorded(finding, actions, now, exc)
                continue
            todo = [a for a in decided if f"action:{a.run.run_id}" in won]
            for action in actions:
                left_alone = passive_result(action)
                if left_alone is not None and f"{action.outcome.value}:{action.run.run_id}" in won:
                    self._record(left_alone)
            if todo:
                ledger.record_decision((finding.dag_id, finding.kept.run_id), [(a.dag_id, a.run.run_id) for a in todo])
                self._track(finding, actions, todo)
            if "detected" in won:
                if self._unrecorded.pop(finding.key, False) is False:  # else announced while unrecorded
                    self._report_detected(finding, actions, now)
            elif len(finding.runs) > 2:  # a pair never grows; >2: runs joined an announced group
                joined = tuple(r.run_id for r in finding.runs if f"detected:{r.run_id}" in won)
                if joined:
                    self._report_detected(finding, actions, now, joined)
            for action in todo:
                result = passive_result(action)
                if result is not None:
                    self._decided(Job(finding, action), result)
                else:
                    queued.append(self._submit(Job(finding, action)))
        if ledger.durable:
            for job in queued:  # a new leader picks these up if this process dies first
                if job.action.writes:
                    ledger.add_pending(Pending(job.finding.key, job.action.dag_id, job.action.run.run_id))
        if failed is not None:
            raise failed

    def _alert_unrecorded(self, finding: Finding, actions: list[Action], now: datetime, exc: Exception) -> None:
        """The ledger cannot record the group's claims (issue 23 §3). Its remediation waits: nothing
        is acted on without a claim, and the failed poll is retried until the ledger takes it. Its
        alert does not: it goes out once per process, saying it may repeat (another replica, or this
        one after a restart, cannot know it was sent)."""
        if finding.key in self._unrecorded:
            return
        self._unrecorded[finding.key] = None
        if len(self._unrecorded) > 10_000:
            self._unrecorded.pop(next(iter(self._unrecorded)))
        cause = getattr(exc, "orig", None) or exc  # a driver error names the cause (e.g. disk full)
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        log.warning("ledger_claim_failed", group_key=finding.key, dag_id=finding.dag_id, error=reason)
        self._report_detected(finding, actions, now, unrecorded=reason)

    def _submit(self, job: Job) -> Job:
        if not self._dispatcher.submit(job):
            log.error("remediation_queue_full", dag_id=job.action.dag_id, run_id=job.action.run.run_id)
            self._decided(job, RemediationResult(job.action, Result.FAILED, "remediation queue full: not attempted"))
        return job

    def _decided(self, job: Job, result: RemediationResult) -> None:
        """A final result no remediation attempt produced: counted and logged like an executed one
        (the alert rules and docs/remediation.md count on every outcome), then reported."""
        self._record(result)
        self._on_result(job, result, True)

    def _record(self, result: RemediationResult) -> None:
        record = getattr(self.parts.remediator, "record", None)  # optional: simple fakes count nothing
        if record is not None:
            record(result)

    def _track(self, finding: Finding, actions: list[Action], todo: list[Action]) -> None:
        runs = {a.run.run_id for a in todo}
        with self._outcomes_lock:
            group = self._outcomes.get(finding.key)
            if group is None:
                self._outcomes[finding.key] = _GroupOutcome(finding, list(actions), open=set(runs), unseen=set(runs))
            else:  # e.g. a third run joined the group while the first remediation is retried
                group.finding, group.actions = finding, list(actions)
                group.open |= runs
                group.unseen |= runs

    def _report_detected(
        self,
        finding: Finding,
        actions: list[Action],
        now: datetime,
        joined: tuple[str, ...] = (),
        unrecorded: str | None = None,
    ) -> None:
        """The DETECTED alert: a group's first, or (``joined``) again for the runs that joined it since."""
        m = self.parts.metrics
        if not joined:
            m.groups_detected.labels(kind=finding.kind.value, confidence=finding.confidence.value).inc()
            m.groups_by_dag.labels(dag_id=finding.dag_id).inc()
        for run in finding.duplicates:
            if run.queued_at is not None and (not joined or run.run_id in joined):
                m.detection_latency.observe(max(0.0, (now - run.queued_at).total_seconds()))
        self.parts.alerter.notify(
            AlertEvent(
                kind=AlertKind.DETECTED,
                finding=finding,
                detected_at=now,
                cluster=self.config.cluster_name,
                mode=self._mode.value,
                actions=tuple(actions),
                assets=finding.assets,
                new_runs=joined,
                unrecorded=unrecorded,
            )
        )

    def _on_result(self, job: Job, result: RemediationResult, final: bool) -> None:
        """A worker's (or the planner's) result: alert when the group's picture changes; forget the
        pending remediation once it is final."""
        run_id = job.action.run.run_id
        event: AlertEvent | None = None
        with self._outcomes_lock:
            group = self._outcomes.get(job.finding.key)
            if group is None:
                group = _GroupOutcome(job.finding, [job.action], open={run_id}, unseen={run_id})
                self._outcomes[job.finding.key] = group
            group.latest[run_id] = result
            group.unseen.discard(run_id)
            if final:
                group.open.discard(run_id)
            if not group.unseen and (not group.announced or final):
                group.announced = True
                event = AlertEvent(
                    kind=AlertKind.OUTCOME,
                    finding=group.finding,
                    detected_at=self.clock(),
                    cluster=self.config.cluster_name,
                    mode=self._mode.value,
                    actions=tuple(group.actions),
                    results=tuple(group.latest.values()),
                    assets=group.finding.assets,
                )
            if not group.open:
                del self._outcomes[job.finding.key]
        if final and job.action.writes and self.parts.ledger.durable:
            try:
                self.parts.ledger.drop_pending(job.action.dag_id, run_id)
            except Exception as exc:  # noqa: BLE001 - a stale pending entry is only re-judged later
                log.warning("pending_remediation_not_cleared", run_id=run_id, error=str(exc))
        if event is not None:
            self.parts.alerter.notify(event)

    def _recheck(self, job: Job) -> tuple[Finding, Action] | RemediationResult:
        """Before a retry: judge the duplicate's group again from the database, earlier decisions
        included. Only a run that is still a duplicate of a confirmed group, not kept by any decision
        and (unless opted in) not started, is acted on; anything else ends the job."""
        verdict = self._rejudge(job.action.dag_id, job.action.run.run_id, self.clock())
        if isinstance(verdict, str):
            dropped = RemediationResult(job.action, Result.SKIPPED if verdict != "gone" else Result.GONE, verdict)
            self._record(dropped)  # final: the dispatcher reports it without an attempt
            return dropped
        finding, action = verdict
        passive = passive_result(action)
        if passive is not None:
            self._record(passive)
            return passive
        return finding, action

    def _rejudge(self, dag_id: str, run_id: str, now: datetime) -> tuple[Finding, Action] | str:
        findings = self.parts.source.rejudge(dag_id, run_id, now)
        if findings is None:
            return "gone"
        for finding in findings:
            for action in plan([finding], self._mode, now=now, remediate_started=self.config.remediate_started):
                if (action.dag_id, action.run.run_id) == (dag_id, run_id):
                    return finding, action
        return "re-judged: no longer a duplicate in a group"

    def _pick_up_pending(self) -> None:
        """A new leader term: remediations an earlier leader decided but did not finish (durable ledger)."""
        try:
            pending = self.parts.ledger.pending()
        except Exception as exc:  # noqa: BLE001 - retried at the next term; the groups stay in the ledger
            log.warning("pending_remediations_unreadable", error=str(exc))
            return
        for item in pending:
            with self._outcomes_lock:
                mine = any(g.finding.dag_id == item.dag_id and item.run_id in g.open for g in self._outcomes.values())
            if mine:
                continue  # still in this process's own queue (this replica led before)
            try:
                verdict = self._rejudge(item.dag_id, item.run_id, self.clock())
            except Exception as exc:  # noqa: BLE001 - e.g. the database blinked: next term
                log.warning("pending_remediation_not_judged", run_id=item.run_id, error=str(exc))
                continue
            if isinstance(verdict, str):
                log.info("pending_remediation_dropped", dag_id=item.dag_id, run_id=item.run_id, reason=verdict)
                self.parts.ledger.drop_pending(item.dag_id, item.run_id)
                continue
            finding, action = verdict
            log.info("pending_remediation_picked_up", dag_id=item.dag_id, run_id=item.run_id)
            job = Job(finding, action, picked_up=False)
            self._track(finding, [action], [action])
            result = passive_result(action)
            if result is not None:
                self._decided(job, result)
            else:
                self._submit(job)

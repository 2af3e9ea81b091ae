"""Remediation off the detection path: a bounded pool of workers fed by the poll loop, with retries.

Why: the poll loop used to wait for every remediation, so a hanging Airflow API
(5 s timeout x 4 attempts) stalled detection of every other duplicate for ~21 s; and a failed
action was never tried again because its claim was already taken.

- ``submit`` never blocks: jobs go into a bounded queue (``queue_size``; full -> ``submit`` says so
  and the caller keeps the job pending, ``detector.app.respond``) served by ``workers`` threads. The depth of
  the queue and the number of jobs waiting for a retry are gauges.
- A ``retryable`` failure (API down, timeout, 5xx, database error) is tried again after a back-off
  that doubles up to ``max_retry_backoff``, for as long as the job lives: a duplicate QUEUED behind
  ``max_active_runs=1`` is still stopped when the API comes back minutes later. Before every retry
  ``recheck`` re-judges the duplicate's group from the database (earlier decisions included) and
  hands back the action to take now, or the final result: a retry only ever acts on a run that is
  still a confirmed, unstarted duplicate and never on the kept run.
- Only the leader acts: ``may_act`` (the leader's fence, ``detector.core.fence``) is asked before every
  attempt; while it says no, the job waits (a new leader finds it in the durable ledger's pending
  list, or by re-judging the group). A job that waited, or whose attempt was refused because the
  fence ended during it, is re-judged from the database before its next attempt: a new leader's
  first look comes after its takeover wait, so it sees what the previous leader wrote. A refused
  attempt is reported neither ``failed`` nor ``done``: the job only waits for leadership.
- ``on_result`` is called for every attempt's result with ``final`` telling whether more follow.

Every call in an attempt has a timeout (API: ``DUPGUARD_AIRFLOW_TIMEOUT``; db: ``statement_timeout``),
so a worker is never lost for good; while all workers wait on a hanging API, later jobs queue up
and detection goes on.
"""

from __future__ import annotations

import heapq
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from detector import logs
from detector.core.model import Finding
from detector.core.plan import Action
from detector.core.ports import RemediationResult, Remediator, Result
from detector.metrics import Metrics

log = logs.get("dupguard.remediation.dispatch")

DEFAULT_WORKERS = 4
DEFAULT_QUEUE_SIZE = 1000
DEFAULT_RETRY_BACKOFF = 1.0
DEFAULT_MAX_RETRY_BACKOFF = 60.0


@dataclass
class Job:
    """One decided action and the group it belongs to; ``attempts`` counts the ones made so far."""

    finding: Finding
    action: Action
    attempts: int = 0
    picked_up: bool = False  # handed over from an earlier leader (durable ledger)
    rejudge: bool = False  # waited for leadership: judge the group again before acting
    results: list[RemediationResult] = field(default_factory=list)


# What a re-judgement says before a retry: the action to take now, or the final result.
Recheck = Callable[[Job], "tuple[Finding, Action] | RemediationResult"]
OnResult = Callable[[Job, RemediationResult, bool], None]

_STOP = object()


class RemediationDispatcher:
    def __init__(
        self,
        remediator: Remediator,
        *,
        recheck: Recheck,
        on_result: OnResult,
        may_act: Callable[[], bool],
        metrics: Metrics | None = None,
        workers: int = DEFAULT_WORKERS,
        queue_size: int = DEFAULT_QUEUE_SIZE,
        retry_backoff: float = DEFAULT_RETRY_BACKOFF,
        max_retry_backoff: float = DEFAULT_MAX_RETRY_BACKOFF,
        retry: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.remediator = remediator
        self.recheck = recheck
        self.on_result = on_result
        self.may_act = may_act
        self.retry_backoff = retry_backoff
        self.max_retry_backoff = max_retry_backoff
        self.retry = retry
        self.clock = clock
        self._ready: queue.Queue[object] = queue.Queue(maxsize=queue_size)
        self._later: list[tuple[float, int, Job]] = []  # (due, seq, job): a heap
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._open = 0  # jobs submitted and not final yet
        self._stopping = threading.Event()
        if metrics is not None:
            metrics.remediation_queue_depth.set_function(self._ready.qsize)
            metrics.remediation_retries_pending.set_function(self.retries_pending)
        self._threads = [
            threading.Thread(target=self._work, name=f"dupguard-remediate-{i}", daemon=True) for i in range(workers)
        ]
        self._threads.append(threading.Thread(target=self._wake_retries, name="dupguard-retry", daemon=True))
        for thread in self._threads:
            thread.start()

    # --- the poll loop's side ----------------------------------------------------------------------

    def submit(self, job: Job) -> bool:
        """Queue ``job`` and return at once; False (and nothing queued) when the queue is full."""
        with self._cond:
            try:
                self._ready.put_nowait(job)
            except queue.Full:
                return False
            self._open += 1
        return True

    def room(self) -> bool:
        """The queue has room for another job."""
        return not self._ready.full()

    def retries_pending(self) -> int:
        with self._cond:
            return len(self._later)

    def idle(self) -> bool:
        """Every submitted job has its final result."""
        with self._cond:
            return self._open == 0

    def drain(self, timeout: float) -> bool:
        """Wait until ``idle`` (``run --once``); False if ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while not self.idle():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 2.0) -> None:
        """Stop taking work; workers finish their current attempt (bounded by the calls' timeouts).
        Jobs still queued or waiting are dropped here: a durable ledger keeps them as pending."""
        self._stopping.set()
        with self._cond:
            dropped = len(self._later) + self._ready.qsize()
            self._later.clear()
            self._cond.notify_all()
        for _ in range(len(self._threads)):
            try:
                self._ready.put_nowait(_STOP)
            except queue.Full:
                break
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if dropped:
            log.warning("remediations_not_finished_at_shutdown", count=dropped)

    # --- workers -----------------------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            item = self._ready.get()
            if item is _STOP or self._stopping.is_set():
                return
            assert isinstance(item, Job)
            try:
                self._attempt(item)
            except Exception:  # a worker must outlive any bad job
                log.exception("remediation_worker_crashed", run_id=item.action.run.run_id)
                self._later_or_final(item, _failed(item.action, "internal error (logged)"))

    def _attempt(self, job: Job) -> None:
        if not self.may_act():
            job.rejudge = True  # another leader may have acted meanwhile
            self._schedule(job, self._delay(max(job.attempts, 1)))  # not the leader now: wait, try later
            return
        if job.attempts > 0 or job.picked_up or job.rejudge:
            try:
                verdict = self.recheck(job)
            except Exception as exc:  # noqa: BLE001 - e.g. the database is down: judge again later
                self._later_or_final(job, _failed(job.action, f"re-judgement failed: {type(exc).__name__}: {exc}"))
                return  # still owes its re-judgement: the next try judges again, never acts on the old plan
            job.rejudge = False
            if isinstance(verdict, RemediationResult):
                self._final(job, verdict)
                return
            job.finding, job.action = verdict
        job.attempts += 1
        result = self.remediator.execute(job.action)
        if result.retryable and not self.may_act():
            # The fence ended during the attempt (refused, or cut short): not a failure of the action.
            log.info("remediation_waits_for_leadership", run_id=job.action.run.run_id, detail=result.detail)
            job.rejudge = True
            self._schedule(job, self.retry_backoff)
        elif result.retryable:
            self._later_or_final(job, result)
        else:
            self._final(job, result)

    def _later_or_final(self, job: Job, result: RemediationResult) -> None:
        if self._stopping.is_set():
            # Shutdown ended the job, not the action: it stays retryable, so the durable ledger keeps its
            # pending entry for the next leader (``detector.app.respond``) and no sink calls it final.
            self._final(job, result)
            return
        if not self.retry:
            self._final(job, replace(result, retryable=False))
            return
        # Refused connections cost the API nothing: keep the first back-off so the duplicate is stopped
        # as soon as the API is back, before its worker's own retry starts the task (benchmarks/results/e2e.md).
        delay = self.retry_backoff if result.retry_soon else self._delay(job.attempts)
        log.warning(
            "remediation_retry_scheduled",
            dag_id=job.action.dag_id,
            run_id=job.action.run.run_id,
            attempts=job.attempts,
            retry_in_seconds=round(delay, 2),
            error=result.detail,
        )
        shown = replace(result, detail=f"{result.detail} (attempt {job.attempts}; retrying in {delay:.0f} s)")
        self._schedule(job, delay)
        self._report(job, shown, final=False)

    def _final(self, job: Job, result: RemediationResult) -> None:
        self._report(job, result, final=True)
        with self._cond:
            self._open -= 1

    def _report(self, job: Job, result: RemediationResult, *, final: bool) -> None:
        job.results.append(result)
        try:
            self.on_result(job, result, final)
        except Exception:  # reporting must not lose the job
            log.exception("remediation_report_failed", run_id=job.action.run.run_id)

    def _delay(self, attempts: int) -> float:
        return float(min(self.max_retry_backoff, self.retry_backoff * 2 ** max(0, attempts - 1)))

    # --- retries -----------------------------------------------------------------------------------

    def _schedule(self, job: Job, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._later, (self.clock() + delay, next(self._seq), job))
            self._cond.notify_all()

    def _wake_retries(self) -> None:
        """Moves jobs whose back-off ended into the queue (blocking while it is full: retries wait)."""
        while not self._stopping.is_set():
            with self._cond:
                now = self.clock()
                if not self._later or self._later[0][0] > now:
                    wait = self._later[0][0] - now if self._later else None
                    self._cond.wait(timeout=wait if wait is None else min(wait, 1.0))
                    continue
                _, _, job = heapq.heappop(self._later)
            while not self._stopping.is_set():
                try:
                    self._ready.put(job, timeout=0.5)
                    break
                except queue.Full:
                    continue


def _failed(action: Action, detail: str) -> RemediationResult:
    return RemediationResult(action=action, result=Result.FAILED, detail=detail, retryable=True)

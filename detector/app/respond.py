"""The leader's response to the duplicate groups a poll found: claim, record, alert, remediate, report.

``Responder.handle`` takes each group through its claims in the ledger (exactly one replica acts on a
run), the roles the judgement gave its runs, the DETECTED alert and the work for the remediation
workers (``detector.actions.remediation.dispatch``: queued, never waited for). The workers' results
come back to ``_on_result``, which sends a group's OUTCOME alert and clears its pending entries; a
retry is re-judged from the source first (``_recheck``). On a new leader term ``pick_up_pending``
takes over what an earlier leader decided but did not finish (durable ledger).

The daemon (``detector.app.daemon``) keeps the loop, leadership and health, and hands this module
only what it uses: the ledger, remediator, alerter and metrics, the source's ``rejudge``, the
leader's permission to write (``may_act``) and the clock.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.exc import StatementError

from detector import logs
from detector.actions.remediation.dispatch import Job, RemediationDispatcher
from detector.actions.remediation.guarded import passive_result
from detector.app.respond_claims import claim_of, planned, record
from detector.config import Config
from detector.core.model import Finding
from detector.core.plan import UNDECIDED, Action, Mode, plan
from detector.core.ports import (
    Alerter,
    AlertEvent,
    AlertKind,
    Ledger,
    Observed,
    Pending,
    RemediationResult,
    Remediator,
    Result,
)
from detector.errors import LedgerFault
from detector.metrics import Metrics

log = logs.get("dupguard.daemon")  # the daemon's lines, as before the split (log queries name the logger)

# ``RunSource.rejudge``: the groups of run (dag_id, run_id) judged afresh; None if it is gone
Rejudge = Callable[[str, str, datetime], list[Finding] | None]
# Jobs kept in memory while the remediation queue is full (a job holds its group's finding, ~2 KB):
# a storm of 100,000 duplicates waits in ~200 MB at most; beyond it a durable ledger's pending list holds them.
DEFERRED_KEPT = 100_000


UNFINISHED = ("queued", "running")  # a dry run's duplicate in these states is judged again


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
    detected_at: datetime | None = None  # the group's DETECTED alert, kept in its OUTCOME alerts
    observed_at: datetime | None = None  # a dry run found it then; judged again in this mode


class Responder:
    """Acts on a leader's findings; built once per daemon, used from the poll loop (``handle``,
    ``pick_up_pending``) and the remediation workers (results, re-judgements)."""

    def __init__(
        self,
        config: Config,
        *,
        ledger: Ledger,
        remediator: Remediator,
        alerter: Alerter,
        metrics: Metrics,
        rejudge: Rejudge,
        may_act: Callable[[], bool],
        clock: Callable[[], datetime],
        retry: bool = True,
        dispatch_options: dict[str, Any] | None = None,
    ) -> None:
        """``rejudge``: the source's (``RunSource.rejudge``). ``may_act``: whether this replica may
        write now (the leader's fence). ``retry``: False for ``run --once`` (nothing is retried later)."""
        self._ledger = ledger
        self._remediator = remediator
        self._alerter = alerter
        self._metrics = metrics
        self._source_rejudge = rejudge
        self._clock = clock
        self._mode = Mode(config.remediation)
        self._remediate_started = config.remediate_started
        self._cluster = config.cluster_name
        self._unstopped = config.unstopped_severity
        self._outcomes: dict[str, _GroupOutcome] = {}
        self._outcomes_lock = threading.Lock()
        # groups alerted while the ledger could not record them: not alerted again once it can
        self._unrecorded: dict[str, None] = {}
        # Jobs the full remediation queue could not take yet (a storm): pending, never "not attempted".
        # The poll loop hands them over as the queue drains (``resubmit``); a durable ledger also holds them.
        self._deferred: deque[Job] = deque()
        self._spilled = False  # jobs beyond DEFERRED_KEPT were left to the durable ledger's pending list
        # Workers: bounded by the engine's pool (2 + 2 overflow), as each remediation re-reads the run.
        self._dispatcher = RemediationDispatcher(
            remediator,
            recheck=self._recheck,
            on_result=self._on_result,
            may_act=may_act,
            metrics=metrics,
            retry=retry,
            **(dispatch_options or {}),
        )

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the queued remediations (``run --once``); False if some are left."""
        deadline = time.monotonic() + timeout
        while self._deferred or self._spilled:
            self.resubmit()
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return self._dispatcher.drain(max(0.0, deadline - time.monotonic()))

    def close(self, timeout: float) -> None:
        """Stop the remediation workers (shutdown), waiting at most ``timeout`` seconds."""
        self._dispatcher.close(timeout=timeout)

    def handle(self, findings: list[Finding], now: datetime, ledger: Ledger | None = None) -> None:
        """Decide, record, alert, then queue the remediations; never waits for one to finish.

        Claims first (exactly one replica acts on a run), then the roles this judgement gave the
        group's runs (a decision is final: later judgements read them back, ``detector.sources.database.prior``), then
        the DETECTED alert, then the work for the remediation workers. One asset event duplicates
        every consumer DAG at once: the workers take the groups in parallel (benchmarks/results/e2e.md).
        """
        ledger = ledger or self._ledger  # the source's own connection when it offers one
        groups = [planned(f, self._mode, now, self._remediate_started) for f in findings]
        try:
            # Every group's claims in one statement, then their records: a storm's poll sent one per group.
            claimed = ledger.claim_groups([(g.finding.key, g.subjects()) for g in groups]) if groups else []
        except Exception as exc:
            for g in groups:
                self._alert_unrecorded(g.finding, g.actions, now, exc)
            raise  # the poll fails and is retried after the alerts
        todos = [g.todo(won) for g, won in zip(groups, claimed, strict=True)]
        for g, won in zip(groups, claimed, strict=True):
            for action in g.actions:
                left_alone = passive_result(action)
                if left_alone is not None and f"{action.outcome.value}:{action.run.run_id}" in won:
                    self._remediator.record(left_alone)
        # Before any group is reported or queued: a new leader picks up a pending stop if this process
        # dies first, even in the middle of a storm's pass (recorded at the pass's end, a pass cut short
        # left its claimed groups with no pending entry, and nobody stopped them).
        failed = record(ledger, [(g.finding, todo) for g, todo in zip(groups, todos, strict=True) if todo], now)
        for g, won, todo in zip(groups, claimed, todos, strict=True):
            finding, actions = g.finding, g.actions
            if todo:
                self._track(finding, actions, todo, now)
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
                    continue
                self._submit(Job(finding, action))
        if failed is not None:
            raise failed

    def _alert_unrecorded(self, finding: Finding, actions: list[Action], now: datetime, exc: Exception) -> None:
        """The ledger cannot record the group's claims (e.g. its volume is full). Its remediation waits: nothing
        is acted on without a claim, and the failed poll is retried until the ledger takes it. Its
        alert does not: it goes out once per process, saying it may repeat (another replica, or this
        one after a restart, cannot know it was sent)."""
        if finding.key in self._unrecorded:
            return
        self._unrecorded[finding.key] = None
        if len(self._unrecorded) > 10_000:
            self._unrecorded.pop(next(iter(self._unrecorded)))
        # SQLAlchemy wraps the driver's error, which names the cause (e.g. disk full)
        cause = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
        reason = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:300]
        log.warning("ledger_claim_failed", group_key=finding.key, dag_id=finding.dag_id, error=reason)
        self._report_detected(finding, actions, now, unrecorded=reason)

    def _submit(self, job: Job) -> Job:
        """Queue ``job``; with the queue full it waits in ``_deferred`` (pending, said so), and beyond
        ``DEFERRED_KEPT`` in the durable ledger only. Only a ledger that keeps nothing reports it failed."""
        if not self._deferred and self._dispatcher.submit(job):
            return job
        if len(self._deferred) < DEFERRED_KEPT:
            if not self._deferred:
                log.warning("remediation_deferred", reason="remediation queue full: pending until it has room")
            job.rejudge = True  # it waited: judged again from the database before it acts
            self._deferred.append(job)
        elif self._ledger.durable and job.action.writes:
            self._untrack(job)  # the ledger's pending entry is its only record now (``resubmit`` picks it up)
            self._spilled = True
        else:
            log.error("remediation_queue_full", dag_id=job.action.dag_id, run_id=job.action.run.run_id)
            detail = f"remediation backlog full ({DEFERRED_KEPT} waiting, no durable ledger): not attempted"
            self._decided(job, RemediationResult(job.action, Result.FAILED, detail))
        return job

    def resubmit(self) -> None:
        """The poll loop's turn: hand deferred jobs to the remediation queue while it has room, then
        (the backlog drained) take up what was left to the durable ledger, as a new leader would."""
        while self._deferred:
            if not self._dispatcher.submit(self._deferred[0]):
                return
            self._deferred.popleft()
        if self._spilled and self._dispatcher.room():
            self._spilled = False
            self.pick_up_pending()

    def deferred(self) -> int:
        """Jobs waiting for room in the remediation queue."""
        return len(self._deferred)

    def _untrack(self, job: Job) -> None:
        run_id = job.action.run.run_id
        with self._outcomes_lock:
            group = self._outcomes.get(job.finding.key)
            if group is not None:
                group.open.discard(run_id)
                group.unseen.discard(run_id)
                if not group.open:
                    del self._outcomes[job.finding.key]

    def _decided(self, job: Job, result: RemediationResult) -> None:
        """A final result no remediation attempt produced: counted and logged like an executed one
        (the alert rules and docs/explanation/remediation.md count on every outcome), then reported."""
        self._remediator.record(result)
        self._on_result(job, result, True)

    def _track(
        self,
        finding: Finding,
        actions: list[Action],
        todo: list[Action],
        detected_at: datetime | None = None,
        observed_at: datetime | None = None,
    ) -> None:
        runs = {a.run.run_id for a in todo}
        with self._outcomes_lock:
            group = self._outcomes.get(finding.key)
            if group is None:
                self._outcomes[finding.key] = _GroupOutcome(
                    finding,
                    list(actions),
                    open=set(runs),
                    unseen=set(runs),
                    detected_at=detected_at,
                    observed_at=observed_at,
                )
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
        m = self._metrics
        if not joined:
            m.groups_detected.labels(kind=finding.kind.value, confidence=finding.confidence.value).inc()
            m.groups_by_dag.labels(dag_id=finding.dag_id).inc()
        for run in finding.duplicates:
            if run.queued_at is not None and (not joined or run.run_id in joined):
                m.detection_latency.observe(max(0.0, (now - run.queued_at).total_seconds()))
        self._alerter.notify(
            AlertEvent(
                kind=AlertKind.DETECTED,
                finding=finding,
                detected_at=now,
                cluster=self._cluster,
                mode=self._mode.value,
                actions=tuple(actions),
                assets=finding.assets,
                new_runs=joined,
                unrecorded=unrecorded,
                unstopped_severity=self._unstopped,
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
                now = self._clock()
                event = AlertEvent(
                    kind=AlertKind.OUTCOME,
                    finding=group.finding,
                    detected_at=group.detected_at or now,
                    cluster=self._cluster,
                    mode=self._mode.value,
                    actions=tuple(group.actions),
                    results=tuple(group.latest.values()),
                    assets=group.finding.assets,
                    unstopped_severity=self._unstopped,
                    outcome_at=now,
                    observed_at=group.observed_at,
                )
            if not group.open:
                del self._outcomes[job.finding.key]
        # A final result still retryable was cut short by this process's shutdown: the next leader retries it.
        if final and job.action.writes and self._ledger.durable and not result.retryable:
            try:
                self._ledger.drop_pending(job.action.dag_id, run_id)
            except LedgerFault:
                pass  # reported once for all (``detector.app.ledger_fault``); a stale entry is only re-judged
            except Exception as exc:  # noqa: BLE001 - a stale pending entry is only re-judged later
                log.warning("pending_remediation_not_cleared", run_id=run_id, error=str(exc))
        if event is not None:
            self._alerter.notify(event)

    def _recheck(self, job: Job) -> tuple[Finding, Action] | RemediationResult:
        """Before a retry: judge the duplicate's group again from the database, earlier decisions
        included. Only a run that is still a duplicate of a confirmed group, not kept by any decision
        and (unless opted in) not started, is acted on; anything else ends the job."""
        verdict = self._rejudge(job.action.dag_id, job.action.run.run_id, self._clock())
        if isinstance(verdict, str):
            dropped = RemediationResult(job.action, Result.SKIPPED if verdict != "gone" else Result.GONE, verdict)
            self._remediator.record(dropped)  # final: the dispatcher reports it without an attempt
            return dropped
        finding, action = verdict
        passive = passive_result(action)
        if passive is not None:
            self._remediator.record(passive)
            return passive
        return finding, action

    def _rejudge(self, dag_id: str, run_id: str, now: datetime) -> tuple[Finding, Action] | str:
        findings = self._source_rejudge(dag_id, run_id, now)
        if findings is None:
            return "gone"
        for finding in findings:
            for action in plan([finding], self._mode, now=now, remediate_started=self._remediate_started):
                if (action.dag_id, action.run.run_id) == (dag_id, run_id):
                    return finding, action
        return "re-judged: no longer a duplicate in a group"

    def pick_up_pending(self) -> bool:
        """A new leader term: remediations an earlier leader decided but did not finish, then (mode fail
        or skip) the duplicates a dry run found (a durable ledger only: another one keeps none). False if
        the ledger could not list the decided ones (retried later)."""
        if not self._ledger.durable:
            return True
        if not self._pick_up_decided():
            return False
        if self._mode in (Mode.FAIL, Mode.SKIP):
            self._pick_up_observed()
        return True

    def _pick_up_decided(self) -> bool:
        try:
            pending = self._ledger.pending()
        except Exception as exc:  # noqa: BLE001 - retried later; the groups stay in the ledger
            log.warning("pending_remediations_unreadable", error=str(exc))
            return False
        with self._outcomes_lock:  # once, not per item: a storm leaves thousands pending
            mine = {(g.finding.dag_id, run_id) for g in self._outcomes.values() for run_id in g.open}
        for item in pending:
            if (item.dag_id, item.run_id) in mine:
                continue  # still in this process's own queue (this replica led before)
            try:
                verdict = self._rejudge(item.dag_id, item.run_id, self._clock())
            except Exception as exc:  # noqa: BLE001 - e.g. the database blinked: next term
                log.warning("pending_remediation_not_judged", run_id=item.run_id, error=str(exc))
                continue
            if isinstance(verdict, str):
                log.info("pending_remediation_dropped", dag_id=item.dag_id, run_id=item.run_id, reason=verdict)
                self._ledger.drop_pending(item.dag_id, item.run_id)
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
        return True

    def _pick_up_observed(self) -> None:
        """The duplicates a dry run would have stopped, judged again now: the dry run decided nothing.

        Each is re-judged from the database (earlier decisions included, so the kept run stays the
        one the dry run named) and decided here at most once, by the same ``action:`` claim ``handle``
        takes: a group a poll or another leader already decided is left as decided. A stop goes
        through the guarded path like any other, which re-reads the run right before writing. Its
        OUTCOME alert updates the dry run's incident (its detection time, and when the dry run found it)."""
        try:
            observed = self._ledger.observed()
        except Exception as exc:  # noqa: BLE001 - retried at the next term; the observations stay
            log.warning("dry_run_observations_unreadable", error=str(exc))
            return
        for item in observed:
            try:
                self._rejudge_observed(item)
            except Exception as exc:  # noqa: BLE001 - e.g. the database blinked: next term
                log.warning("dry_run_observation_not_judged", run_id=item.run_id, error=str(exc))

    def _rejudge_observed(self, item: Observed) -> None:
        verdict = self._rejudge(item.dag_id, item.run_id, self._clock())
        fields = {"dag_id": item.dag_id, "run_id": item.run_id, "observed_at": item.at.isoformat()}
        why = verdict if isinstance(verdict, str) else None
        if not isinstance(verdict, str):
            finding, action = verdict
            if action.kept_run_id != item.kept_run_id:  # the recorded keep prevents it: never act then
                why = f"the kept run is now {action.kept_run_id}, not {item.kept_run_id}"
            elif action.run.state not in UNFINISHED:  # long over: no stop, and no alert months later
                why = f"the duplicate is {action.run.state}"
            elif action.outcome in UNDECIDED:  # e.g. no longer confirmed: nothing to decide
                why = action.outcome.value
            elif claim_of(action) not in self._ledger.claim_all(finding.key, [claim_of(action)]):
                why = "decided before: a decision is final"
        if why is not None:
            log.info("dry_run_observation_dropped", reason=why, **fields)
            self._ledger.drop_observed(item.dag_id, item.run_id)
            return
        log.info("dry_run_observation_judged_again", outcome=action.outcome.value, **fields)
        self._ledger.record_decision((finding.dag_id, finding.kept.run_id), [(action.dag_id, action.run.run_id)])
        if action.writes:  # a new leader finishes it if this process dies first
            self._ledger.add_pending(Pending(finding.key, action.dag_id, action.run.run_id))
        self._ledger.drop_observed(item.dag_id, item.run_id)
        job = Job(finding, action)
        self._track(finding, [action], [action], detected_at=item.at, observed_at=item.at)
        result = passive_result(action)
        if result is not None:
            self._decided(job, result)
        else:
            self._submit(job)

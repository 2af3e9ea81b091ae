"""Carrying out planned remediations: the shared guard, the dry-run executor and the backend factory.

Planning (``detector.core.plan``) already decided *whether* a duplicate may be touched. This module owns
the last look before a write and everything around it, for every backend alike:

- only ``Action.writes`` actions (outcome ``remediate``) of mode ``fail``/``skip`` are ever written,
  and never the kept run (checked again here, defence in depth);
- right before acting the duplicate's run and task-instance states are re-read from the metadata
  DB (``run_state.run_state``) and judged by ``judge``: gone -> GONE, a task started -> TOO_LATE
  (unless ``remediate_started``), already stopped -> ALREADY;
- and the kept run is re-read too (``judge_kept``): a duplicate is never stopped once its kept run is
  gone or was itself stopped, before it ran or as a duplicate (another writer acted on a judgement
  made elsewhere, e.g. a deposed leader's late write): stopping it too would leave the work to no run;
- one canonical log line and the ``dupguard_remediations_total`` / ``..._latency_seconds``
  metrics per action; ``execute`` never raises.

Backends (``Backend``) do the write and re-check the guard themselves where it matters: ``db``
inside its locked transaction (``detector.actions.remediation.db``), ``api`` between retries
(``detector.actions.remediation.api``). Dry-run and off use no backend: dry-run reads and logs "would …".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Protocol

from sqlalchemy import Connection, Engine

from detector import logs
from detector.core.decisions import NOTE_PREFIXES
from detector.core.fence import LeadershipLost
from detector.core.model import ti_started
from detector.core.plan import Action, Mode, Outcome
from detector.core.ports import RemediationResult, Result, StartedTask
from detector.metadb import run_state
from detector.metadb.engine import connect, refuse_standby
from detector.metadb.run_state import KeptRun, RunState, TaskState
from detector.metadb.schema import AirflowTables
from detector.metrics import Metrics

log = logs.get("dupguard.remediation")

# airflow/utils/state.py State.finished; everything else (None included) is unfinished.
FINISHED_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})
# What set_dag_run_state_to_failed marks FAILED rather than SKIPPED (mark_tasks.py,
# docs/explanation/airflow-internals.md, "What marking a run failed does").
FAIL_AS_FAILED_STATES = frozenset({"running", "deferred", "up_for_reschedule"})
# Finished without running user code: a run left with only these did no work.
NOT_RUN_STATES = frozenset({"skipped", "removed", "upstream_failed"})


# --- the guard (pure) --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Work:
    """The state changes one remediation makes, computed from the re-read states."""

    mode: Mode
    run_pk: int
    to_fail: tuple[TaskState, ...]  # fail mode: running-like tasks (only with remediate_started)
    to_skip: tuple[TaskState, ...]  # every other unfinished task
    fail_run: bool
    # every task that had started when judged (only with remediate_started), whether the write acts on
    # it or it had already finished: the read-back reports each as having run (never ``done``)
    ran: tuple[TaskState, ...] = ()

    def describe(self) -> str:
        parts = []
        if self.fail_run:
            parts.append("run -> failed")
        if self.to_skip:
            parts.append("skipped: " + ", ".join(_ti_name(t) for t in self.to_skip))
        if self.to_fail:
            parts.append("failed: " + ", ".join(_ti_name(t) for t in self.to_fail))
        return "; ".join(parts) or "note only"


@dataclass(frozen=True, slots=True)
class Verdict:
    """Either a final result (nothing to write) or the work to do."""

    result: Result | None
    detail: str = ""
    work: Work | None = None


def _ti_name(ti: TaskState) -> str:
    return ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"


def _worker_ran(ti: TaskState) -> bool:
    """A worker's ti_run stamps pid and a first heartbeat on the task (routes/task_instances.py
    L190-197 in 3.1.2); a task failed while still queued has neither."""
    return ti.state not in {"failed", "up_for_retry"} or ti.pid is not None or ti.last_heartbeat_at is not None


def judge(action: Action, current: RunState | None, *, remediate_started: bool) -> Verdict:
    """What may still be done to ``action.run`` given its states right now.

    Order matters: a deleted (or re-created) run is GONE; a run whose user code ran is TOO_LATE
    unless the operator opted in; a run with nothing left to stop is ALREADY (idempotency: the
    second execute of the same action lands here).
    """
    if current is None or current.id != action.run.id:
        return Verdict(Result.GONE, "the run no longer exists")
    started = [t for t in current.tasks if ti_started(t.state, t.pid, t.last_heartbeat_at)]
    if started and not remediate_started:
        names = ", ".join(f"{_ti_name(t)}={t.state}" for t in started)
        if not any(_worker_ran(t) for t in started):
            # e.g. a worker that could not reach the Execution API gave up and Airflow failed the
            # queued task: still left alone (a decision never reverses), but told as it happened
            return Verdict(Result.TOO_LATE, f"too late: Airflow ended its tasks before any worker ran them ({names})")
        return Verdict(Result.TOO_LATE, f"too late, both runs executed: tasks already started ({names})")
    unfinished = [t for t in current.tasks if t.state not in FINISHED_TI_STATES]
    mode = action.mode
    if mode is Mode.FAIL and current.state == "failed":
        return Verdict(Result.ALREADY, "the run is already failed")
    # Fail mode with every task skipped but the run unfinished is a stop half landed, not ALREADY: in
    # 3.0.6-3.2.2 set-failed commits each skip in a session of its own (mark_tasks.py, ti.set_state
    # without the request's session; fixed in 3.3.2), so a request that fails after it leaves the run
    # queued without its note. The run is failed and noted now (no task to touch): the note is the
    # decision's record another leader reads.
    not_run = bool(current.tasks) and all(t.state in NOT_RUN_STATES for t in current.tasks)
    if not_run and (mode is Mode.SKIP or current.state == "success"):
        return Verdict(Result.ALREADY, f"every task is already skipped (run state {current.state})")
    if mode is Mode.SKIP and not unfinished:
        return Verdict(Result.ALREADY, f"no unfinished task left (run state {current.state})")
    if mode is Mode.FAIL and current.state in {"success"}:
        return Verdict(Result.ALREADY, "the run already finished")
    to_fail = tuple(t for t in unfinished if mode is Mode.FAIL and t.state in FAIL_AS_FAILED_STATES)
    to_skip = tuple(t for t in unfinished if t not in to_fail)
    work = Work(
        mode=mode, run_pk=current.id, to_fail=to_fail, to_skip=to_skip, fail_run=mode is Mode.FAIL, ran=tuple(started)
    )
    return Verdict(None, work.describe(), work)


def judge_kept(action: Action, kept: KeptRun | None) -> Verdict | None:
    """None while the kept run still stands; else the refusal to stop ``action.run``.

    The keep decision was taken on an earlier read; a write made since (a deposed leader's request
    still landing, an operator, the guard) may have stopped the kept run. Stopping the duplicate too
    would leave the group's events to no run: never both runs of a group. Airflow's record decides,
    as for every note (``detector.core.decisions.note_agrees``): the kept run is gone, or it ended
    stopped (failed, or every task skipped) and either none of its tasks ran or its note says dupguard
    or its guard stopped it. A kept run that ran and failed on its own did the work: its duplicate is
    still stopped; a stop note on a run Airflow shows unstopped is no decision (judged afresh).
    """
    name = action.kept_run_id
    if kept is None:
        return Verdict(Result.SKIPPED, f"refused: the kept run {name} no longer exists; this run is left alone")
    tasks = kept.state.tasks
    if not (kept.state.state == "failed" or (tasks and all(t.state in NOT_RUN_STATES for t in tasks))):
        return None
    if kept.note is not None and kept.note.startswith(NOTE_PREFIXES):
        why = "was stopped as a duplicate (its note in dupguard's words)"
    elif not any(ti_started(t.state, t.pid, t.last_heartbeat_at) for t in tasks):
        why = "was stopped before any task ran"
    else:
        return None
    return Verdict(
        Result.SKIPPED, f"refused: the kept run {name} {why}, state {kept.state.state}; this run is left alone"
    )


# --- backends ------------------------------------------------------------------------------------


Recheck = Callable[[], Verdict]


@dataclass(frozen=True, slots=True)
class Applied:
    """What a backend reports back: a result, why, and when the change was committed."""

    result: Result
    detail: str = ""
    committed_at: datetime | None = None
    started_tasks: tuple[StartedTask, ...] = ()  # read back after the write (detector.actions.remediation.readback)
    retryable: bool = False  # FAILED for a reason that may pass (API down, timeout, database error)
    retry_soon: bool = False  # ... and nothing reached the target (connection refused): retry soon


class Backend(Protocol):
    name: str

    def apply(self, action: Action, work: Work, recheck: Recheck) -> Applied:
        """Make the state change of ``work`` (already judged allowed) and the note. May raise."""
        ...


def read_state(engine: Engine, tables: AirflowTables, action: Action) -> RunState | None:
    """The guard's re-read: one short read-only transaction, never on a standby (it may lag the primary:
    a task that started there would look queued). Checked in the re-read's own transaction,
    which also pins it to one server connection behind a pooler."""
    with connect(engine) as conn:
        refuse_standby(conn, "DUPGUARD_DATABASE_URL", "re-reads a run before a write")
        return run_state.run_state(conn, tables, action.dag_id, action.run.run_id)


class RunStates(Protocol):
    """Where the guard's re-read and a backend's read-back come from: the metadata database, or the
    REST API (``--source api``, ``sources.api.reader.ApiRunStates``). ``RunState.id`` is the run the
    action names while it exists."""

    def state(self, action: Action) -> RunState | None: ...

    def note(self, action: Action) -> str | None: ...

    def kept(self, action: Action) -> KeptRun | None:
        """The kept run (``action.kept_run_id``) with its note, or None when it is gone."""
        ...


class DbRunStates:
    def __init__(self, engine: Engine, tables: AirflowTables) -> None:
        self.engine = engine
        self.tables = tables

    def state(self, action: Action) -> RunState | None:
        return read_state(self.engine, self.tables, action)

    def note(self, action: Action) -> str | None:
        with connect(self.engine) as conn:
            refuse_standby(conn, "DUPGUARD_DATABASE_URL", "reads a write back")
            after = run_state.run_state(conn, self.tables, action.dag_id, action.run.run_id)
            return run_state.run_note(conn, self.tables, after.id) if after is not None else None

    def kept(self, action: Action) -> KeptRun | None:
        with connect(self.engine) as conn:
            refuse_standby(conn, "DUPGUARD_DATABASE_URL", "re-reads the kept run before a write")
            return read_kept(conn, self.tables, action)


def read_kept(conn: Connection, tables: AirflowTables, action: Action, *, lock: bool = False) -> KeptRun | None:
    """The kept run and its note on ``conn``; ``lock`` holds its dag_run row ``FOR SHARE`` (the ``db``
    backend's write transaction: no other writer can stop it until the commit)."""
    kept = run_state.run_state(conn, tables, action.dag_id, action.kept_run_id, share=lock)
    return None if kept is None else KeptRun(kept, run_state.run_note(conn, tables, kept.id))


# --- the executor ---------------------------------------------------------------------------------


_PASSIVE_RESULTS = {
    # planned from task states alone: a task Airflow failed while queued looks started here too, so
    # this says what was seen, not that both runs executed (the re-read's verdict can tell, judge())
    Outcome.TOO_LATE: (Result.TOO_LATE, "too late: its tasks had left queued when planned; left alone"),
    Outcome.PREVENTED: (Result.ALREADY, "the in-scheduler guard created it with every task skipped"),
    Outcome.NOT_CONFIRMED: (Result.SKIPPED, "group not confirmed: never remediated"),
    Outcome.DISABLED: (Result.SKIPPED, "remediation is off"),
    Outcome.STOPPED_BEFORE: (Result.ALREADY, "its note says dupguard already stopped it"),
    Outcome.KEPT_BEFORE: (Result.SKIPPED, "an earlier decision kept this run: never remediated"),
}


def passive_result(action: Action) -> RemediationResult | None:
    """The result of an action that writes nothing and needs no re-read (too late, prevented, stopped
    or kept before, not confirmed, off); None for the ones a worker carries out."""
    if action.outcome not in _PASSIVE_RESULTS:
        return None
    result, detail = _PASSIVE_RESULTS[action.outcome]
    return RemediationResult(action=action, result=result, detail=detail)


class GuardedRemediator:
    """The one ``Remediator``: routes each action, runs the guard, calls the backend, records it.

    ``backend`` None means nothing is ever written (modes off and dry-run). ``engine`` None (mode
    off) means nothing is even read. ``states`` replaces ``engine``/``tables`` as the source of the
    re-read (``--source api``: the REST API).
    """

    def __init__(
        self,
        *,
        configured_mode: Mode,
        backend: Backend | None,
        engine: Engine | None,
        tables: AirflowTables | None,
        metrics: Metrics | None,
        remediate_started: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        states: RunStates | None = None,
    ) -> None:
        self.configured_mode = configured_mode
        self.backend = backend
        if states is None and engine is not None and tables is not None:
            states = DbRunStates(engine, tables)
        self.states = states
        self.metrics = metrics
        self.remediate_started = remediate_started
        self.clock = clock

    def close(self) -> None:
        """Release the backend's connections (the API client's HTTP pool)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()

    def prepare(self) -> str | None:
        """Let the backend get ready off the detection path (the API backend fetches its token);
        returns why it cannot act at once (None: ready, or nothing to prepare), and publishes it as
        ``dupguard_remediation_ready{backend}``."""
        prepare = getattr(self.backend, "prepare", None)
        if prepare is None or self.backend is None:
            return None
        problem: str | None = prepare()
        if self.metrics is not None:
            self.metrics.remediation_ready.labels(backend=self.backend.name).set(0 if problem else 1)
        return problem

    @property
    def backend_name(self) -> str:
        return self.backend.name if self.backend is not None else "none"

    def execute(self, action: Action) -> RemediationResult:
        started = self.clock()
        try:
            applied = self._execute(action)
        except LeadershipLost as exc:
            # Not a result of the action (nothing counted): the dispatcher waits for leadership, then re-judges.
            log.info("remediation_fenced", dag_id=action.dag_id, run_id=action.run.run_id, detail=str(exc))
            return RemediationResult(action=action, result=Result.FAILED, detail=f"not written: {exc}", retryable=True)
        except Exception as exc:  # noqa: BLE001 - the daemon's loop must survive anything a backend does
            applied = Applied(Result.FAILED, _describe(exc), retryable=True)
        elapsed = self.clock() - started
        self._record(action, applied, elapsed)
        return RemediationResult(
            action=action,
            result=applied.result,
            detail=applied.detail,
            committed_at=applied.committed_at,
            started_tasks=applied.started_tasks,
            retryable=applied.retryable and applied.result is Result.FAILED,
            retry_soon=applied.retry_soon and applied.result is Result.FAILED,
        )

    def _execute(self, action: Action) -> Applied:
        if action.run.run_id == action.kept_run_id:
            # Unreachable through plan(); a remediation of the kept run is the worst possible bug.
            return Applied(Result.FAILED, "refused: this is the kept run")
        if action.outcome in _PASSIVE_RESULTS:
            result, detail = _PASSIVE_RESULTS[action.outcome]
            return Applied(result, detail)
        if action.outcome is Outcome.WOULD_REMEDIATE or (action.writes and self.backend is None):
            return self._dry_run(action)
        if not action.writes or action.mode not in (Mode.FAIL, Mode.SKIP) or action.mode is not self.configured_mode:
            return Applied(
                Result.SKIPPED,
                f"refused: outcome {action.outcome}, mode {action.mode}, configured {self.configured_mode}",
            )
        assert self.backend is not None and self.states is not None
        states = self.states

        def recheck() -> Verdict:
            verdict = judge(action, states.state(action), remediate_started=self.remediate_started)
            if verdict.work is None:
                return verdict
            return judge_kept(action, states.kept(action)) or verdict

        verdict = recheck()
        if verdict.work is None:
            assert verdict.result is not None
            return Applied(verdict.result, verdict.detail)
        applied = self.backend.apply(action, verdict.work, recheck)
        # A backend's failure (API down or timing out, 5xx, auth, database) may pass: the dispatcher
        # retries it, re-judging first (detector.actions.remediation.dispatch). Refusals above never are.
        return replace(applied, retryable=True) if applied.result is Result.FAILED else applied

    def _dry_run(self, action: Action) -> Applied:
        """Everything short of the write: the same re-read and verdict, logged as "would …"."""
        if self.states is None:
            return Applied(Result.SKIPPED, "remediation is off")
        mode = action.mode if action.mode in (Mode.FAIL, Mode.SKIP) else Mode.FAIL
        as_if = Action(
            action.finding_key, action.dag_id, action.run, action.kept_run_id, action.outcome, mode, action.note
        )
        verdict = judge(as_if, self.states.state(action), remediate_started=self.remediate_started)
        if verdict.work is not None:
            verdict = judge_kept(action, self.states.kept(action)) or verdict
        if verdict.work is None:
            assert verdict.result is not None
            return Applied(verdict.result, verdict.detail)
        event = "would_fail_run" if mode is Mode.FAIL else "would_skip_tasks"
        log.info(
            event,
            dag_id=action.dag_id,
            run_id=action.run.run_id,
            kept_run_id=action.kept_run_id,
            finding_key=action.finding_key,
            changes=verdict.work.describe(),
            note=action.note,
            reason="confirmed duplicate of the kept run (same asset trigger)",
        )
        return Applied(
            Result.DRY_RUN,
            f"would {'fail the run' if mode is Mode.FAIL else 'skip its tasks'}: {verdict.work.describe()}",
        )

    def record(self, result: RemediationResult) -> None:
        """Count and log a result no attempt of ``execute`` produced (the planner's, a full queue's, a
        re-judgement's): every outcome gives one increment and one ``remediation`` line."""
        self._record(result.action, Applied(result.result, result.detail), 0.0)

    def _record(self, action: Action, applied: Applied, elapsed: float) -> None:
        if self.metrics is not None:
            self.metrics.remediations.labels(
                mode=action.mode.value, backend=self.backend_name, result=applied.result.value
            ).inc()
            if applied.committed_at is not None:
                self.metrics.remediation_latency.observe(elapsed)
        warn = (Result.FAILED, Result.TOO_LATE, Result.CAUGHT_AFTER_START, Result.UNKNOWN)
        level = "warning" if applied.result in warn or applied.detail.startswith("refused") else "info"
        getattr(log, level)(
            "remediation",
            result=applied.result.value,
            mode=action.mode.value,
            outcome=action.outcome.value,
            backend=self.backend_name,
            dag_id=action.dag_id,
            run_id=action.run.run_id,
            kept_run_id=action.kept_run_id,
            finding_key=action.finding_key,
            detail=applied.detail,
            started_tasks=[t.describe() for t in applied.started_tasks],
            elapsed_ms=round(elapsed * 1000, 1),
        )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def now_utc() -> datetime:
    return datetime.now(UTC)

"""Backend ``api``: the remediation through Airflow 3's REST API with ``apache-airflow-client``.

- ``fail``: ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}`` ``{"state": "failed", "note": …}``;
  Airflow's ``set_dag_run_state_to_failed`` then marks the TIs (docs/explanation/airflow-internals.md, "What marking a
  run failed does") and fires its listeners.
- ``skip``: the unfinished TIs -> skipped through the bulk TI endpoint (one call), then the note
  alone (``update_mask=["note"]``). Refused at start-up on Airflow 3.0/3.1 (``ConfigError``): their
  scheduler can put skipped tasks back (``DagRun.schedule_tis`` updates by id without a state check,
  dagrun.py L2046 in 3.1.2; 3.2 added the check), and the TI endpoint does not lock the ``dag_run``
  row the scheduler holds, so no read-back right after the write can prove the skip will last.

After the write the run's task instances are read again (metadata DB, or the REST API with `--source api`) and judged by
``detector.actions.remediation.readback``: a task that started in the window between the guard's re-read
and Airflow's write makes the result ``caught_after_start`` (naming it), a write that did not hold
``failed``.

Auth, TLS, timeouts and the classification of answers are ``detector.airflowapi`` (shared with
the api source): a token from ``POST /auth/token`` or a static one, refreshed before its ``exp``; a
401 invalidates it and is retried once; wrong credentials fail at once, then back off.

Every call has a timeout. 5xx answers and transport errors (timeouts, refused connections) are
retried with exponential back-off, and the guard re-reads the run between attempts, so a retry never
acts on a run whose tasks started meanwhile. Fencing (docs/explanation/remediation.md, Leadership and fencing):
right before every HTTP write — each PATCH, each retry — the leader's fence is asked again; none
(the lease ended) raises ``LeadershipLost`` and nothing is sent, else the write's whole timeout is
clipped to the lease left, so no request of ours is still open after the lease ends.
404 means the run was deleted: GONE, not retried.
Responses are read as JSON, not through the client's models (``detector.airflowapi.client``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from airflow_client.client import (
    ApiClient,
    BulkBodyBulkTaskInstanceBody,
    DagRunApi,
    DagRunMutableStates,
    DAGRunPatchBody,
    TaskInstanceApi,
)
from sqlalchemy import Engine

from detector import logs
from detector.actions.remediation.guarded import Applied, DbRunStates, Recheck, RunStates, Work, now_utc
from detector.actions.remediation.readback import NO_START_DATE, read_back
from detector.airflowapi import permissions
from detector.airflowapi.client import Gone, Transient
from detector.airflowapi.session import Session
from detector.airflowapi.tokens import Budget, TokenSource
from detector.config import Config
from detector.core.fence import UNFENCED, FenceSource, LeadershipLost
from detector.core.plan import Action, Mode
from detector.core.ports import Result
from detector.errors import AirflowApiError, AirflowAuthError, ConfigError, DupguardError
from detector.metadb.run_state import RunState
from detector.metadb.schema import AirflowTables, Family

log = logs.get("dupguard.remediation.api")

# Airflow versions whose scheduler can undo a skip made through the API: DagRun.schedule_tis sets
# SCHEDULED by TI id without re-checking the state (dagrun.py L2046 in 3.1.2, L1990 in 3.0.6);
# 3.2.2 added ``schedulable_state_clause`` to that UPDATE.
_SKIP_UNDONE = frozenset({Family.AIRFLOW_3_0, Family.AIRFLOW_3_1})
# A read that failed: the database's errors, or through the API (--source api) its 5xx and timeouts
# too, which must not pass for a failed write (the read-back of a PATCH Airflow answered is not one).
_READ_FAILED = (DupguardError, Transient)


@dataclass(slots=True)
class _BulkSkips:
    """What one action's bulk skips came to across its attempts. The note is sent after the bulk skip,
    so the run can end up with every task skipped without our note; this tells whose skip that is as
    far as can be known (answered: ours, judged at once; unanswered: a retry's re-check cannot tell)."""

    answered: datetime | None = None  # when Airflow answered one without errors: the skip is ours
    unanswered: bool = False  # one went out and no answer came (a timeout, a 5xx): it may have landed


class ApiBackend:
    name = "api"

    def __init__(
        self,
        session: Session,
        *,
        engine: Engine | None = None,
        tables: AirflowTables | None = None,
        states: RunStates | None = None,
        attempts: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        fence: FenceSource = lambda: UNFENCED,
    ) -> None:
        self.session = session
        self.fence = fence  # the leader's permission to write, asked before every write
        if states is None:
            assert engine is not None and tables is not None, "the read-back needs the database or states"
            states = DbRunStates(engine, tables)
        self.states = states  # the read-back after each write: the database, or the API (--source api)
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        self._token_failing = False  # prepare() could not get a token last time (logged once)
        self.dag_runs = DagRunApi(session.client)
        self.task_instances = TaskInstanceApi(session.client)

    @property
    def client(self) -> ApiClient:
        return self.session.client

    @property
    def tokens(self) -> TokenSource:
        return self.session.tokens

    @property
    def timeout(self) -> float:
        return self.session.timeout

    def write_timeout(self) -> float:
        """The timeout for one write, asked right before it is sent: the call timeout clipped to the
        lease left, so the request is closed on our side before the lease ends; ``LeadershipLost``
        (nothing sent) when there is no valid fence."""
        fence = self.fence()
        if fence is None or not fence.valid():
            raise LeadershipLost("this replica's leader lease ended (or it is waiting to act): nothing sent")
        return min(self.timeout, fence.remaining())

    @classmethod
    def from_config(
        cls,
        config: Config,
        engine: Engine | None,
        tables: AirflowTables | None,
        *,
        family: Family | None = None,
        states: RunStates | None = None,
        auth_backoff: float = 60.0,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> ApiBackend:
        if not config.airflow_api_url:
            raise AirflowApiError("the api backend needs DUPGUARD_AIRFLOW_API_URL")
        family = tables.family if tables is not None else family
        if config.remediation == Mode.SKIP.value and family in _SKIP_UNDONE:
            assert family is not None
            raise ConfigError(
                [
                    f"DUPGUARD_REMEDIATION=skip with DUPGUARD_REMEDIATION_BACKEND=api is refused on Airflow "
                    f"{family.value}: its scheduler can put the skipped tasks back (DagRun.schedule_tis); "
                    "use DUPGUARD_REMEDIATION=fail, or skip with DUPGUARD_REMEDIATION_BACKEND=db"
                ]
            )
        session = Session.from_config(config, auth_backoff=auth_backoff, clock=clock)
        return cls(session, engine=engine, tables=tables, states=states, **options)

    def close(self) -> None:
        self.session.close()

    def prepare(self) -> str | None:
        """Hold a fresh token before any duplicate needs it: POST /auth/token costs ~0.5 s, longer than
        the ~100 ms a duplicate's first task waits. A no-op while the cached token is fresh; wrong
        credentials stay behind TokenSource's back-off, so this never becomes a login storm. Returns
        why no token could be had (None: one is held). Called off the detection path and off the
        leader heartbeat (the daemon's preparer thread): a hanging API delays neither."""
        try:
            self.tokens.get(Budget())
        except (AirflowApiError, Transient) as exc:
            # Once per state change, not at every leader check (about once a second).
            if not self._token_failing:
                log.warning("airflow_token_unavailable", error=str(exc))
            self._token_failing = True
            return f"no token from the Airflow API: {exc}"
        if self._token_failing:
            log.info("airflow_token_available")
        self._token_failing = False
        return None

    # --- one action ---------------------------------------------------------------------------------

    def apply(self, action: Action, work: Work, recheck: Recheck) -> Applied:
        budget = Budget()
        skips = _BulkSkips()
        last = ""
        refused = conflict = False
        for attempt in range(1, self.attempts + 1):
            try:
                unwritten = self._apply_once(action, work, budget, skips)
                if unwritten is not None:
                    # Airflow answered our bulk skip and the note after it failed: the skip is ours
                    assert skips.answered is not None
                    done = self._read_back(action, work, skips.answered)
                    return replace(done, detail=f"{done.detail} (applied, but its note was not written: {unwritten})")
                return self._read_back(action, work, now_utc())
            except Gone as exc:
                return Applied(Result.GONE, f"HTTP 404 from the Airflow API: {exc}")
            except AirflowAuthError as exc:
                return Applied(Result.FAILED, str(exc))
            except Transient as exc:
                last, refused, conflict = str(exc), exc.refused, exc.conflict
            if attempt == self.attempts:
                break
            self.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            landed = self._landed(action, work)  # a timed-out PATCH may have been applied all the same
            if landed is not None:
                return Applied(
                    landed.result,
                    f"{landed.detail} (applied although the attempt failed: {last})",
                    committed_at=landed.committed_at,
                    started_tasks=landed.started_tasks,
                )
            try:
                verdict = recheck()  # the run may have started, finished or vanished meanwhile
            except _READ_FAILED as exc:
                # No retry can be judged without the run (and nothing more is sent): the attempts end as
                # after the last one, retryable, and the dispatcher re-judges the group before trying again
                return self._failed(
                    attempt, last, refused, f"; the re-check before attempt {attempt + 1} could not read the run: {exc}"
                )
            if verdict.work is None:
                assert verdict.result is not None
                if verdict.result is Result.ALREADY and conflict:
                    # 409: another writer (a second replica) stopped it; ours did not apply
                    return Applied(Result.ALREADY, f"{verdict.detail} (our write conflicted: {last})")
                if verdict.result is Result.ALREADY:
                    # _landed found no note of ours: stopped by someone else, or it cannot be told
                    detail = f"{verdict.detail} (after a failed attempt: {last})"
                    return self._stopped_meanwhile(action, detail, maybe_ours=skips.unanswered)
                return Applied(verdict.result, f"{verdict.detail} (after a failed attempt: {last})")
            work = verdict.work
            log.info("remediation_retry", dag_id=action.dag_id, run_id=action.run.run_id, attempt=attempt, error=last)
        landed = self._landed(action, work)
        if landed is not None:
            return Applied(
                landed.result,
                f"{landed.detail} (applied although the last attempt failed: {last})",
                committed_at=landed.committed_at,
                started_tasks=landed.started_tasks,
            )
        return self._failed(self.attempts, last, refused)

    def _failed(self, attempts: int, last: str, refused: bool, then: str = "") -> Applied:
        """Every attempt made failed (``refused``: the last never reached Airflow, so retry soon)."""
        shown = self.session.shown_url
        detail = f"Airflow API at {shown} failed {attempts} times: {last}{then}"
        return Applied(Result.FAILED, detail, retry_soon=refused)

    def _landed(self, action: Action, work: Work) -> Applied | None:
        """After a failed attempt: if the run carries this action's note, Airflow applied the PATCH
        (``fail`` sends state and note in one request, ``skip`` sends the note last), so judge it
        by the read-back; None when it did not land (or cannot be told), so the caller re-checks."""
        try:
            after = self.states.state(action)
            note = self.states.note(action) if after is not None else None
        except _READ_FAILED:
            return None
        if after is None or note != action.note:
            return None
        return self._judged(action, work, after, now_utc())

    def _stopped_meanwhile(self, action: Action, detail: str, *, maybe_ours: bool) -> Applied:
        """A run found stopped after an attempt of ours failed, without our note: ``already``, saying
        who as far as its note tells (an operator's words, another writer's); ``unknown`` when even
        the note cannot be read or is ours yet its read-back is not (``done`` needs that proof), or
        when a bulk skip of ours went out unanswered (``maybe_ours``): it may be what skipped them."""
        try:
            note = self.states.note(action)
        except _READ_FAILED as exc:
            return Applied(Result.UNKNOWN, f"{detail}; whether our write did it is unknown (note unreadable: {exc})")
        if note == action.note:
            return Applied(Result.UNKNOWN, f"{detail}; our note is there but the run could not be read back")
        who = f"its note says {note[:200]!r}" if note else "it has no note (an operator, Airflow or another writer)"
        if maybe_ours:
            sent = "dupguard's bulk skip was sent and not answered, so it may have done it"
            return Applied(Result.UNKNOWN, f"{detail}; {sent}: {who}")
        return Applied(Result.ALREADY, f"{detail}; not stopped by dupguard's write: {who}")

    def _read_back(self, action: Action, work: Work, committed: datetime) -> Applied:
        """The run as Airflow left it, judged against the guard's re-read (detector.actions.remediation.readback).

        The PATCH has been answered, so its transaction committed; but without a read-back nothing
        proves that it held or that no task had started: ``unknown`` (alerted so), never ``done``.
        """
        try:
            after = self.states.state(action)
        except _READ_FAILED as exc:
            return Applied(
                Result.UNKNOWN,
                f"{work.describe()} answered by Airflow, but the read-back failed ({exc}): check the run",
                committed_at=committed,
            )
        return self._judged(action, work, after, committed)

    def _judged(self, action: Action, work: Work, after: RunState | None, committed: datetime) -> Applied:
        """The read-back's verdict; a fail-mode write says it left the start_date empty (NO_START_DATE),
        whether its answer arrived or it landed after a failed attempt."""
        checked = read_back(action.mode, (*work.to_fail, *work.to_skip), work.describe(), after, ran=work.ran)
        detail = checked.detail + (NO_START_DATE if action.mode is Mode.FAIL and not work.ran else "")
        return Applied(checked.result, detail, committed_at=committed, started_tasks=checked.started)

    def _apply_once(self, action: Action, work: Work, budget: Budget, skips: _BulkSkips) -> str | None:
        """One attempt; raises when nothing of it is known to have applied. Returns why the note was not
        written after a bulk skip Airflow answered (None: it was): that skip is ours whatever befell the
        note (a 5xx, a timeout, the lease ended at its fence, a 403), on any attempt, the last one too,
        so it is judged by the read-back, never retried (a retry would find it ``already``)."""
        dag_id, run_id = action.dag_id, action.run.run_id
        if action.mode is Mode.FAIL:
            body = DAGRunPatchBody(state=DagRunMutableStates.FAILED, note=action.note)
            self.session.call(
                "PATCH dagRun state=failed",
                lambda h: self.dag_runs.patch_dag_run_without_preload_content(
                    dag_id, run_id, body, _request_timeout=self.write_timeout(), _headers=h
                ),
                budget,
                needs=permissions.EDIT_RUNS,
            )
            return None
        if work.to_skip or work.to_fail:
            self._skip_tasks(dag_id, run_id, work, budget, skips)
        note = DAGRunPatchBody(note=action.note)
        try:
            self.session.call(
                "PATCH dagRun note",
                lambda h: self.dag_runs.patch_dag_run_without_preload_content(
                    dag_id, run_id, note, update_mask=["note"], _request_timeout=self.write_timeout(), _headers=h
                ),
                budget,
                needs=permissions.EDIT_RUNS,
            )
        except (Transient, LeadershipLost, AirflowApiError) as exc:
            if skips.answered is None:
                raise  # no bulk skip of ours was answered (none needed): nothing of ours is known to have applied
            return str(exc)
        return None

    def _skip_tasks(self, dag_id: str, run_id: str, work: Work, budget: Budget, skips: _BulkSkips) -> None:
        tasks = (*work.to_skip, *work.to_fail)
        bulk = BulkBodyBulkTaskInstanceBody.from_dict(
            {
                "actions": [
                    {
                        "action": "update",
                        "entities": [
                            {"task_id": ti.task_id, "map_index": ti.map_index, "new_state": "skipped"} for ti in tasks
                        ],
                    }
                ]
            }
        )
        assert bulk is not None
        try:
            answer = self.session.call(
                "PATCH taskInstances (bulk skip)",
                lambda h: self.task_instances.bulk_task_instances_without_preload_content(
                    dag_id, run_id, bulk, _request_timeout=self.write_timeout(), _headers=h
                ),
                budget,
                needs=permissions.EDIT_TASK_INSTANCES,
            )
        except Transient as exc:
            # Refused: it never reached Airflow; 409: Airflow refused it. Else Airflow may have applied it.
            skips.unanswered = skips.unanswered or not (exc.refused or exc.conflict)
            raise
        errors = (answer.get("update") or {}).get("errors") or []
        if errors:
            if any(isinstance(e, dict) and e.get("status_code") == 404 for e in errors):
                raise Gone(f"bulk skip: {errors}")
            raise AirflowApiError(f"bulk skip of {dag_id}/{run_id} reported errors: {errors}")
        skips.answered = now_utc()

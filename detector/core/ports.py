"""The interfaces between the daemon and its side effects. Each side effect lives in its own module
and receives its client (engine, HTTP session, Slack client) as a parameter, so tests inject real
local servers or fakes without patching.

- ``Ledger``: durable (or in-memory) record of what was already handled: exactly-once across
  restarts, replicas and overlapping polls.
- ``Remediator``: carries out one planned ``Action`` (api or db backend; dry-run logs only).
- ``Alerter``: takes an ``AlertEvent`` and delivers it later, off the detection path: ``notify``
  must return at once (Slack never delays detection or remediation).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from detector.core.model import Finding
from detector.core.plan import Action


@dataclass(frozen=True, slots=True)
class Pending:
    """A remediation decided (its claim taken) but not finished: the duplicate to stop, and its group."""

    finding_key: str
    dag_id: str
    run_id: str


@dataclass(frozen=True)
class Observed:
    """A duplicate a dry run would have stopped (its observation, not a decision): a leader in mode
    fail or skip judges it again, keeping the same kept run (docs/explanation/remediation.md)."""

    finding_key: str
    dag_id: str
    run_id: str
    kept_run_id: str
    at: datetime  # when the dry run found it


class Ledger(Protocol):
    durable: bool

    def claim(self, group_key: str, subject: str) -> bool:
        """Record that ``subject`` (e.g. "alert", "remediate:<run_id>") is being handled for the group.

        True exactly once per (group_key, subject), for every replica and across restarts.
        """
        ...

    def claim_all(self, group_key: str, subjects: list[str]) -> set[str]:
        """``claim`` for several subjects at once (one round trip); returns the subjects won."""
        ...

    def claim_groups(self, claims: Sequence[tuple[str, Sequence[str]]]) -> list[set[str]]:
        """``claim_all`` for several groups at once (one round trip): the subjects each group won, in
        the order asked. The same as ``claim_all`` group after group: a (group, subject) asked twice
        is won by its first asker at most."""
        ...

    def remember(self, group_key: str, name: str, value: str) -> None:
        """Keep a small value for the group (e.g. the Slack thread ts)."""
        ...

    def recall(self, group_key: str, name: str) -> str | None: ...

    def watermark(self) -> int | None:
        """Highest dag_run id fully examined by a previous leader, if known."""
        ...

    def save_watermark(self, high: int) -> None: ...

    def record_decision(self, kept: tuple[str, str], duplicates: Iterable[tuple[str, str]]) -> None:
        """Remember which run (dag_id, run_id) one judgement kept and which it chose as duplicates.
        A role once recorded is never changed (a decision is final)."""
        ...

    def record_decisions(self, judgements: Sequence[tuple[tuple[str, str], Sequence[tuple[str, str]]]]) -> None:
        """``record_decision`` of several judgements (kept, duplicates) at once (one round trip)."""
        ...

    def decisions(self, runs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], set[str]]:
        """The roles (``kept`` / ``duplicate``) earlier judgements gave ``runs``."""
        ...

    def add_pending(self, item: Pending) -> None:
        """A remediation that is decided but not finished (a new leader picks it up)."""
        ...

    def add_pending_many(self, items: Sequence[Pending]) -> None:
        """``add_pending`` of several remediations at once (one round trip)."""
        ...

    def drop_pending(self, dag_id: str, run_id: str) -> None: ...

    def pending(self) -> list[Pending]: ...

    def add_observed(self, item: Observed) -> None:
        """A duplicate the dry run would have stopped (kept by a durable ledger for a later mode)."""
        ...

    def add_observed_many(self, items: Sequence[Observed]) -> None:
        """``add_observed`` of several duplicates at once (one round trip)."""
        ...

    def drop_observed(self, dag_id: str, run_id: str) -> None: ...

    def observed(self) -> list[Observed]: ...

    def on(self, conn: Any) -> Ledger:
        """The same ledger on ``conn``, an open connection to its database that the calling thread
        holds (fewer round trips), or the ledger itself when it keeps no state there."""
        ...


class Result(enum.StrEnum):
    DONE = "done"  # the state change is committed
    DRY_RUN = "dry_run"  # logged what would be done
    ALREADY = "already"  # already stopped, not by this write (an earlier action, the guard, an operator, Airflow)
    TOO_LATE = "too_late"  # re-read showed started tasks: not touched
    CAUGHT_AFTER_START = "caught_after_start"  # committed, but a task had started before the write: stopped mid-run
    GONE = "gone"  # the run was deleted (404)
    # a write was sent and answered, but nothing proves what it did (its read-back failed): check the run
    UNKNOWN = "unknown"
    FAILED = "failed"  # could not be done; ``detail`` says why
    SKIPPED = "skipped"  # nothing to do for this outcome (not confirmed, disabled, prevented)


@dataclass(frozen=True)
class StartedTask:
    """A task instance that had started when a remediation's write landed (read back after it).

    ``before``: its state in the guard's re-read (e.g. ``queued``), ``after``: in the read-back
    (``failed``: it was running and the write stopped it; ``success``: it finished in between).
    """

    task_id: str
    map_index: int
    before: str | None
    after: str | None

    @property
    def name(self) -> str:
        return self.task_id if self.map_index < 0 else f"{self.task_id}[{self.map_index}]"

    def describe(self) -> str:
        return f"{self.name} ({self.before or 'none'} -> {self.after or 'none'})"


@dataclass(frozen=True)
class RemediationResult:
    action: Action
    result: Result
    detail: str = ""
    committed_at: datetime | None = None
    started_tasks: tuple[StartedTask, ...] = ()  # CAUGHT_AFTER_START: the tasks that ran and were stopped
    retryable: bool = False  # a FAILED result worth another attempt later (remediation_dispatch)
    # retryable, and nothing reached the target (API connection refused): retry at the shortest
    # back-off, so a duplicate is stopped as soon as the API is back (its worker retries too)
    retry_soon: bool = False


class Remediator(Protocol):
    def execute(self, action: Action) -> RemediationResult:
        """Carry out ``action`` (only ``action.writes`` ones change anything). Never raises."""
        ...

    def prepare(self) -> str | None:
        """Get ready to act at once (e.g. refresh an API token); called after every leader check
        while this replica leads, in a thread of its own (never on the poll loop or the heartbeat).
        Returns why it cannot act at once (None: ready). Never raises."""
        ...

    def record(self, result: RemediationResult) -> None:
        """Count and log a result no ``execute`` produced (the planner's, a full queue's, a
        re-judgement's), as an executed one is. Never raises."""
        ...

    def close(self) -> None:
        """Release connections (HTTP sessions); called once at shutdown."""
        ...


class AlertKind(enum.StrEnum):
    DETECTED = "detected"
    OUTCOME = "outcome"  # remediation done / failed / too late, a follow-up to DETECTED


@dataclass(frozen=True)
class AlertEvent:
    kind: AlertKind
    finding: Finding
    detected_at: datetime
    cluster: str
    mode: str
    actions: tuple[Action, ...] = ()
    results: tuple[RemediationResult, ...] = field(default=())
    assets: tuple[str, ...] = ()  # names (or URIs) of the triggering asset(s), when the caller knows them
    # DETECTED again for a group announced before: the run ids that joined it since (a group
    # that grows is never silent; empty on a group's first alert)
    new_runs: tuple[str, ...] = ()
    # Why the ledger could not record this alert (it is sent anyway, and says it may repeat); None: recorded
    unrecorded: str | None = None
    # The severity of a duplicate that will run or ran (DUPGUARD_UNSTOPPED_SEVERITY: critical or warning)
    unstopped_severity: str = "critical"
    # OUTCOME: when the results came in (``detected_at`` stays the group's detection); None on DETECTED
    outcome_at: datetime | None = None
    # OUTCOME of a duplicate a dry run found earlier and a later mode judged again: when the dry run found it
    observed_at: datetime | None = None


class Alerter(Protocol):
    def notify(self, event: AlertEvent) -> None:
        """Queue ``event`` for delivery and return at once. Never raises."""
        ...

    def close(self, timeout: float) -> None:
        """Deliver what is queued within ``timeout`` seconds, then stop; log what was not delivered."""
        ...

    def trouble(self) -> str | None:
        """Alerts lately undelivered, and why, for ``/readyz``'s body (None: none)."""
        ...


@dataclass(frozen=True)
class Polled:
    """What one poll of a source saw: how many new runs, and the groups they belong to."""

    new_runs: int
    findings: list[Finding]
    more: bool = False  # a batch was full: poll again at once
    ledger: Ledger | None = None  # the ledger on the source's own connection, to handle these findings with
    # A race may follow (``detector.core.pace``): the asset queues changed or asset runs appeared. None: the
    # source cannot tell (the REST API), and the daemon polls at ``poll_interval`` throughout.
    stirred: bool | None = None
    asset_runs: int = 0  # new asset-triggered runs among ``new_runs``: the next poll goes at once (core.pace)


class RunSource(Protocol):
    """Where the daemon's runs come from: the metadata database or Airflow's REST API.

    A *term* is one stretch of leading: ``start`` opens it (where this process's last term stopped,
    or a durable cursor, else the look-back), ``end`` closes it when the lead is lost. ``poll`` raises
    on failure; ``failed`` then undoes that poll's progress, so the next poll sees the same runs again
    (nothing lost).
    """

    name: str  # "database" or "api"
    family: str  # Airflow's schema family ("3.1"), for dupguard_build_info
    coverage_gap: str | None  # the last runs a term start could not judge (a health reason), if any

    @property
    def watching(self) -> bool: ...

    def ping(self) -> str | None:
        """None while the source answers; else why not (one line, no secret)."""
        ...

    def start(self, now: datetime) -> None: ...

    def end(self) -> None: ...

    def stood_by(self, live_leader: bool) -> None:
        """A standby's leader check: ``live_leader`` when another replica leads and the source answers
        (what that leader has had time to judge need not be judged again by this process's next term)."""
        ...

    def poll(self, now: datetime) -> Polled: ...

    def commit(self) -> None:
        """The last poll's findings are handled (claimed): make its progress durable, if it can be."""
        ...

    def failed(self, exc: BaseException) -> str:
        """Undo the failed poll's progress; the error as one line for logs and /readyz."""
        ...

    def rejudge(self, dag_id: str, run_id: str, now: datetime) -> list[Finding] | None:
        """The groups of run ``(dag_id, run_id)`` judged afresh (earlier decisions included); None if it is gone."""
        ...

    def summary(self) -> dict[str, object]:
        """Fields for the summary log line (e.g. the watermark)."""
        ...

    def close(self) -> None: ...

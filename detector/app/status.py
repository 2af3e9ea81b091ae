"""What this replica can do right now, in one word: ``/readyz``, the ``dupguard_up`` and
``dupguard_state`` gauges, and one log line per change (a warning when it cannot detect or act).

A replica is *up* while it leads and its polls succeed, or while it stands by with a working lock
connection and a live leader elsewhere. Every other state names why it is down; the reason text is
already redacted (``detector.metadb.engine.describe_error``). ``evaluate`` is pure; ``StatusBoard`` holds the
current status and does the logging and the gauges.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from enum import StrEnum

from detector import logs
from detector.app.leader import LEADER_UNRESPONSIVE, LOCK_ON_STANDBY, LOCK_POOLED, LOCK_REFUSED, LockProblem
from detector.metrics import Metrics

log = logs.get("dupguard.status")


class State(StrEnum):
    STARTING = "starting"
    LEADING = "leading"
    WAITING_TO_ACT = "waiting_to_act"  # just took the lock: detects and alerts, writes after the takeover wait
    STANDBY = "standby"
    DATABASE_UNREACHABLE = "database_unreachable"  # the metadata database does not answer
    API_UNREACHABLE = "api_unreachable"  # --source api: Airflow's REST API does not answer
    POLL_FAILING = "poll_failing"  # leader, but polls fail (e.g. the database refuses a read)
    LEDGER_FAULT = "ledger_fault"  # leader that detects and alerts, but its durable ledger cannot record
    LOCK_UNAVAILABLE = "lock_unavailable"  # the leader-lock connection fails (password, lock key, network)
    LOCK_REFUSED = "lock_refused"  # lock_mode=session through a pooler
    LOCK_ON_STANDBY = "lock_on_standby"  # the lock URL reached a hot standby (reader endpoint): no lock there
    LEADER_UNRESPONSIVE = "leader_unresponsive"  # the lock's holder is stalled: no replica acts
    LOCK_POOLED = "lock_pooled"  # a pooler shares the lock's server session (a fooled pinning proof)


UP_STATES = frozenset({State.LEADING, State.WAITING_TO_ACT, State.STANDBY})


@dataclass(frozen=True)
class Status:
    state: State
    reason: str

    @property
    def up(self) -> bool:
        return self.state in UP_STATES


STARTING = Status(State.STARTING, "connecting to Airflow (the metadata database, or the REST API with --source api)")


def evaluate(
    *,
    db_error: str | None,
    leader: bool,
    poll_error: str | None,
    lock: LockProblem | None,
    api_error: str | None = None,
    waiting: float | None = None,
    remediation: str | None = None,
    ledger: str | None = None,
) -> Status:
    """The status from what the last checks found (most fundamental cause first). ``remediation``:
    why the remediation cannot act at once (e.g. no token from Airflow's API); a leader that detects
    stays up, and its reason says so. ``ledger``: what is broken in the durable ledger; a leader
    with a broken ledger detects and alerts but may not act, so it is down, its reason naming the repair."""
    if db_error is not None:
        return Status(State.DATABASE_UNREACHABLE, db_error)
    if api_error is not None:
        return Status(State.API_UNREACHABLE, api_error)
    if leader:
        if ledger is not None:  # first: while the ledger is broken, the polls fail because of it
            return Status(State.LEDGER_FAULT, ledger)
        if poll_error is not None:
            return Status(State.POLL_FAILING, poll_error)
        if lock is not None and lock.code == LOCK_POOLED:  # down, though it acts: the set-up needs fixing
            return Status(State.LOCK_POOLED, f"holds the leader lock and polls, but {lock.reason}")
        if waiting is not None:
            return Status(
                State.WAITING_TO_ACT,
                f"holds the leader lock; waits {waiting:.1f} s more before its first write, for the writes "
                "the previous leader may still land (docs/explanation/remediation.md, Leadership and fencing)",
            )
        if remediation is not None:
            return Status(State.LEADING, f"holds the leader lock and polls; remediation not ready: {remediation}")
        return Status(State.LEADING, "holds the leader lock and polls")
    if lock is not None:
        states = {
            LOCK_REFUSED: State.LOCK_REFUSED,
            LEADER_UNRESPONSIVE: State.LEADER_UNRESPONSIVE,
            LOCK_ON_STANDBY: State.LOCK_ON_STANDBY,
            LOCK_POOLED: State.LOCK_POOLED,
        }
        state = states.get(lock.code, State.LOCK_UNAVAILABLE)
        return Status(state, lock.reason)
    return Status(State.STANDBY, "another replica holds the leader lock")


class StatusBoard:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self.current = STARTING
        self.note: str | None = None  # added to every reason, e.g. the last coverage gap
        for state in State:
            metrics.state.labels(state=state.value).set(0)
        self._publish(STARTING)

    def update(self, status: Status) -> None:
        """Record ``status``; log once when the state (not just its reason's wording) changes."""
        if self.note is not None:
            status = Status(status.state, f"{status.reason}; {self.note}")
        with self._lock:
            previous, self.current = self.current, status
            if status.state is previous.state:
                return
            self._publish(status)
        if status.up:
            log.info("status_changed", state=status.state.value, previous=previous.state.value, reason=status.reason)
        else:
            log.warning("status_changed", state=status.state.value, previous=previous.state.value, reason=status.reason)

    def _publish(self, status: Status) -> None:
        for state in State:
            self._metrics.state.labels(state=state.value).set(1 if state is status.state else 0)
        self._metrics.up.set(1 if status.up else 0)

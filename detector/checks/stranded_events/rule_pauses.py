"""Was a DAG paused when an event was registered? What Airflow's ``log`` table says (pure).

Airflow queues nothing for a paused DAG (by design), so an event registered while its consumer was
paused is not stranded, whatever happened after. Airflow keeps no history of ``dag.is_paused``; what it
records is the action that changed it, one ``log`` row each (read in Airflow 3.0.6-3.3.2's code and
checked on a real API server, tests/integration/test_pause_log_api.py):

* the CLI (``airflow dags pause`` / ``unpause``): ``cli_dag_pause`` / ``cli_dag_unpause``, ``dag_id`` the
  argument (with ``--treat-dag-id-as-regex`` a pattern: it names no DAG, so it is a bulk record);
* the REST API ``PATCH /api/v2/dags/{dag_id}`` and the UI's toggle (which calls it): ``patch_dag`` with
  ``extra`` ``{"is_paused": <the body's value>, "method": "PATCH"}`` on 3.1+; 3.0.x writes
  ``"is_paused": false`` whatever the body said (``params["is_paused"] == "false"`` on a JSON boolean),
  so there the direction is unknown;
* ``PATCH /api/v2/dags`` (many DAGs by filters): ``patch_dags``, no ``dag_id``: a bulk record.

The row is written before the change commits (the CLI's action logger runs first, the API's
``action_logging`` is a dependency of the endpoint), so a record at the event's very time counts.

The state at an event's time: the newest record at or before it (a bulk or direction-less one: unknown).
With none, an unpause after it says the DAG was paused until then; otherwise the DAG was unpaused if the
log reaches back to the DAG's first schedule reference (its oldest row is not newer), else ``airflow db
clean`` may have taken the record that said: unknown. An empty log (never written: a test database) is
taken as complete. Unknown is never judged "paused" and never pages as ``error`` (``rule.observe``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime

from detector.checks.stranded_events.rule import CandidateEvent

PAUSE = "cli_dag_pause"
UNPAUSE = "cli_dag_unpause"
PATCH_DAG = "patch_dag"
PATCH_DAGS = "patch_dags"
EVENTS = (PAUSE, UNPAUSE, PATCH_DAG, PATCH_DAGS)


@dataclass(frozen=True)
class PauseRecord:
    at: datetime
    dag_id: str | None  # None: a bulk change (or a pattern) naming no one DAG
    paused: bool | None  # None: the row does not say which way


@dataclass(frozen=True)
class PauseLog:
    records: tuple[PauseRecord, ...]
    oldest: datetime | None  # the log table's oldest row (any event); None: the table is empty
    readable: bool = True  # False: no SELECT on ``log`` (nothing is known)


def record(
    event: str, dag_id: str | None, at: datetime, extra: str | None, *, names_dag: bool, patch_direction: bool
) -> PauseRecord:
    """One ``log`` row of ``EVENTS`` as a record. ``names_dag``: its ``dag_id`` is a DAG's id (not a pattern,
    not NULL); ``patch_direction``: ``patch_dag`` rows record the body's ``is_paused`` (Airflow 3.1+)."""
    who = dag_id if names_dag and event != PATCH_DAGS else None
    if event in (PAUSE, UNPAUSE):
        return PauseRecord(at, who, event == PAUSE)
    paused = _is_paused(extra) if event == PATCH_DAG and patch_direction else None
    return PauseRecord(at, who, paused)


def _is_paused(extra: str | None) -> bool | None:
    try:
        value = json.loads(extra or "")
    except ValueError:
        return None
    flag = value.get("is_paused") if isinstance(value, dict) else None
    return flag if isinstance(flag, bool) else None


def paused_at(log: PauseLog, dag_id: str, t: datetime, floor: datetime | None) -> bool | None:
    """True: paused at ``t``; False: unpaused; None: the log cannot say (see the module doc)."""
    if not log.readable:
        return None
    own = sorted((r for r in log.records if r.dag_id in (dag_id, None)), key=lambda r: r.at)
    before = [r for r in own if r.at <= t]
    if before:
        return before[-1].paused if before[-1].dag_id is not None else None
    after = next(iter(r for r in own if r.at > t), None)
    if after is not None and after.dag_id is not None and after.paused is False:
        return True  # unpaused later, nothing in between: paused until then
    if after is not None and (after.paused is None or after.dag_id is None):
        return None
    if log.oldest is None or log.oldest <= (floor if floor is not None else t):
        return False  # the log covers the DAG's life: no pause before t
    return None  # `airflow db clean` may have removed the record before t


def with_pauses(candidates: Iterable[CandidateEvent], log: PauseLog) -> list[CandidateEvent]:
    return [replace(c, paused_then=paused_at(log, c.dag_id, c.timestamp, c.schedule_floor)) for c in candidates]

"""The repair of a stranded set (apache/airflow#56050): which queue row to write back, or why not.

The write puts back the ``asset_dag_run_queue`` row Airflow's ``ON CONFLICT DO NOTHING`` left out, with
``created_at`` = the newest stranded event's timestamp ``T``. Airflow's own scheduler then makes the run
(docs/explanation/airflow-internals.md, "Repairing a stranded set"): ``triggered_date`` = the newest queue row's
``created_at`` = ``T``, and the run consumes the events of the DAG's assets with ``previous < timestamp <= T``, where
``previous`` is the newest ``run_after`` of the DAG's asset-triggered runs below ``T`` (3.0.6-3.3.2; 3.3's catchup
floor applies only when there is no previous run, and a stranded set always has one). So the plan writes only when
that window, read from the database, holds **exactly** the stranded events.

Refused (the alert says why; on-call can still create one asset event by hand):

* a DAG on anything but one asset (AND/OR of several, an alias, a name/uri reference): another asset's
  queue row could make a run that takes these events while the row is written, an AND condition would
  wait for assets dupguard cannot vouch for, and alias events are in the window from 3.1 only;
* a partitioned DAG (3.2+, ``timetable_partitioned``): its runs come from ``asset_partition_dag_run``;
* a window other than the set (an event consumed by another run, or one the set does not hold);
* a set holding a trigger's copy of a message a run of the DAG consumed (``StrandedSet.copies``, proven
  or only by an equal payload): the window holds every event of the set, so the run would process that
  message again. Checked first: it never changes;
* a set with an event the ``log`` table cannot place outside a pause (``CandidateEvent.paused_then`` None):
  Airflow by design runs nothing for an event registered while the DAG was paused.

Skipped (the state moved on, nothing to repair): a queue row of the DAG now, an event of the set
consumed, a run at or after ``T``, the DAG paused. Pure: rows in, a plan out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from detector.checks.stranded_events.rule import StrandedSet

REPAIR_KIND = "stranded_repair"


@dataclass(frozen=True)
class WindowEvent:
    event_id: int
    asset_id: int
    consumed: bool  # by any run of this DAG


@dataclass(frozen=True)
class RepairState:
    """One DAG as the scheduler would see it for a queue row created at ``T`` (one snapshot)."""

    dag_id: str
    paused: bool
    partitioned: bool  # dag.timetable_partitioned (3.2+; False before)
    expression: Any  # dag.asset_expression (JSON) as Airflow serialized the DAG's schedule
    scheduled_assets: tuple[int, ...]  # dag_schedule_asset_reference.asset_id
    queue_rows: int
    previous_run_after: datetime | None  # newest run_after of its asset-triggered runs below T
    later_runs: tuple[str, ...]  # its asset-triggered runs with run_after >= T
    window: tuple[WindowEvent, ...]  # events of its assets with previous < timestamp <= T
    consumed: tuple[int, ...]  # events of the set some run of the DAG consumed


@dataclass(frozen=True)
class Requeue:
    dag_id: str
    asset_ids: tuple[int, ...]
    created_at: datetime  # T
    event_ids: tuple[int, ...]

    def describe(self) -> str:
        rows = ", ".join(f"(asset_id={a}, target_dag_id={self.dag_id!r})" for a in self.asset_ids)
        return f"INSERT INTO asset_dag_run_queue {rows} created_at={self.created_at.isoformat()} ON CONFLICT DO NOTHING"


@dataclass(frozen=True)
class Refusal:
    outcome: Literal["refused", "skipped"]
    reason: str


def requeue_at(s: StrandedSet) -> datetime:
    """``T``: the newest stranded event (the set is in time order)."""
    return max(e.timestamp for e in s.events)


def single_asset(expression: Any) -> bool:
    """Whether Airflow's serialized condition names exactly one asset (``{"asset": …}``, possibly
    wrapped in a one-element ``all``/``any``, as ``schedule=[asset]`` is)."""
    while isinstance(expression, Mapping) and len(expression) == 1:
        ((op, inner),) = expression.items()
        if op == "asset":
            return True
        if op in ("all", "any") and isinstance(inner, list) and len(inner) == 1:
            expression = inner[0]
            continue
        return False
    return False


def plan_requeue(s: StrandedSet, state: RepairState) -> Requeue | Refusal:
    ids = set(s.event_ids)
    if s.copies:
        return Refusal(
            "refused",
            "; ".join(f"event {c.event_id} is {c.describe()}" for c in s.copies)
            + ": a run of the window would process that message again (a trigger ran on two triggerers)",
        )
    unknown = [e.event_id for e in s.events if e.paused_then is not False]
    if unknown:
        return Refusal(
            "refused", f"the log cannot say whether {s.dag_id} was paused at event(s) {unknown} (purged, not recorded)"
        )
    if state.queue_rows:
        return Refusal("skipped", f"DAG {s.dag_id} has a queue row now: Airflow's scheduler makes its run")
    if state.consumed:
        return Refusal("skipped", f"event(s) {sorted(state.consumed)} consumed by a run meanwhile")
    if state.later_runs:
        return Refusal("skipped", f"asset run(s) {', '.join(state.later_runs)} at or after the newest event exist")
    if state.paused:
        return Refusal("skipped", f"DAG {s.dag_id} is paused now: Airflow queues nothing for it")
    if state.partitioned:
        return Refusal("refused", "a partitioned DAG: its runs come from asset_partition_dag_run, not the queue")
    if not single_asset(state.expression) or len(state.scheduled_assets) != 1:
        return Refusal(
            "refused",
            f"DAG {s.dag_id} is scheduled on more than one asset, an alias or a name reference: a queue row "
            "could make a premature run, or another asset's run could take these events while it is written",
        )
    if state.previous_run_after is None:
        return Refusal("refused", "no earlier asset run bounds the window: it would reach back to the first event")
    window = {w.event_id for w in state.window}
    if window != ids or any(w.consumed for w in state.window):
        extra, missing = sorted(window - ids), sorted(ids - window)
        return Refusal(
            "refused",
            f"the run's window ({state.previous_run_after.isoformat()}, {requeue_at(s).isoformat()}] would "
            f"not be exactly the stranded events (also {extra}, without {missing})",
        )
    assets = tuple(sorted({w.asset_id for w in state.window}))
    if set(assets) != set(state.scheduled_assets):
        return Refusal("refused", f"the events are not of the DAG's scheduled asset {state.scheduled_assets}")
    return Requeue(dag_id=s.dag_id, asset_ids=assets, created_at=requeue_at(s), event_ids=s.event_ids)


@dataclass(frozen=True)
class RepairedRun:
    run_id: str
    event_ids: tuple[int, ...]


def verify(plan: Requeue, runs: list[RepairedRun]) -> RepairedRun | None:
    """The run the repair made: the DAG's asset run with ``run_after`` = ``T`` that consumed exactly the
    set (``runs`` are those with that run_after); None while there is none."""
    for run in runs:
        if sorted(run.event_ids) == sorted(plan.event_ids):
            return run
    return None

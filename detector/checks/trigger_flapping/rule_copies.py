"""Copies of one message that carry no id: reported as suspected, never linked, never remediated.

Why (docs/explanation/airflow-internals.md, "One message, one asset event per triggerer"): a trigger run by two
triggerers submits one event per copy, and only a message id proves two events are one message
(``core.trigger_event``). Without one, equal payloads were a first rule, and the end-to-end run (a
``FileDeleteTrigger`` watcher, payload ``true`` for every file) made 20 false groups of it: there the copies
*compete* for a file, so each file gives one event and equal payloads are distinct messages. What is reported
here is narrower:

* the payload is a message every copy receives (``trigger_event.broadcast``: a Redis pub/sub message;
  competing triggers' copies meet a message twice only on a redelivery, which looks like a repeat);
* two triggerer jobs were alive at every event of the set (``trigger_flapping.alive_at``, on the
  jobs' own timestamps), and the caller has seen the trigger flapping (``run``) or the release
  lacks the filter (``scan``'s exposure);
* equal payloads of one asset within ``window`` of each other: a copy picks a message up at its next
  poll (redis ``AwaitMessageTrigger.poll_interval``, 60 s by default, kept only encrypted in
  ``trigger.kwargs``) and hands it to ``submit_event`` within about two of the triggerer's one-second
  loops;
* consumed by two or more runs of one DAG, one of them *extra*: every event that run consumed is a copy of
  an event an earlier run (by id: creation order) of its DAG consumed. A later run that also consumed a new,
  different message was needed for that message anyway: the copy rode along (absorbed), no run was added.
  Copies one run consumed made none (the stranded check names the other copy).

Pure: rows in, records out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from detector.core.detect import ALL_DAGS, DagFilter
from detector.core.model import ASSET_TRIGGERED, Run
from detector.core.trigger_event import Copies, TriggerEvent, copies


@dataclass(frozen=True, slots=True)
class SuspectedCopies:
    """Runs of one DAG that consumed different events carrying equal broadcast payloads."""

    dag_id: str
    asset_id: int
    event_ids: tuple[int, ...]  # the set's events these runs consumed
    runs: tuple[Run, ...]  # by id: every run of the DAG that consumed one of them
    first: datetime  # the set's first and last event
    last: datetime
    first_run: Run  # the run that consumed the message first
    extra_runs: tuple[Run, ...]  # by id: runs that consumed nothing but copies earlier runs had consumed


def suspected_copies(
    events: Iterable[TriggerEvent],
    window: timedelta,
    consumed: Mapping[int, frozenset[int]],
    runs: Iterable[Run],
    two_alive: Callable[[datetime], bool],
    dag_filter: DagFilter = ALL_DAGS,
) -> list[SuspectedCopies]:
    """``consumed``: run id -> the events it consumed; ``two_alive``: whether two triggerers ran then."""
    mine = {e.id: e for e in events if e.broadcast and not e.message_ids}
    chosen = [
        r
        for r in {r.id: r for r in runs}.values()
        if r.run_type == ASSET_TRIGGERED and r.partition_key is None and dag_filter.selects(r.dag_id)
    ]
    chains = [c for c in copies(mine.values(), window) if all(two_alive(mine[e].timestamp) for e in c.event_ids)]
    extra = extra_runs(chosen, consumed, chains)
    found: list[SuspectedCopies] = []
    for chain in chains:
        stamps = sorted(mine[e].timestamp for e in chain.event_ids)
        by_dag: dict[str, list[Run]] = {}
        for r in chosen:
            if consumed.get(r.id, frozenset()) & chain.event_ids:
                by_dag.setdefault(r.dag_id, []).append(r)
        for dag_id, dag_runs in sorted(by_dag.items()):
            dag_runs.sort(key=lambda r: r.id)
            extras = tuple(r for r in dag_runs if r.id in extra)
            if not extras:  # one run, or every later one also carried a message of its own
                continue
            used = sorted({e for r in dag_runs for e in consumed[r.id] & chain.event_ids})
            asset_id = mine[used[0]].asset_id
            found.append(
                SuspectedCopies(
                    dag_id, asset_id, tuple(used), tuple(dag_runs), stamps[0], stamps[-1], dag_runs[0], extras
                )
            )
    return found


def extra_runs(runs: Iterable[Run], consumed: Mapping[int, frozenset[int]], chains: Iterable[Copies]) -> set[int]:
    """The ids of the runs that consumed only copies of what earlier runs of their DAG consumed: each of
    their events is in a set of ``chains`` of which an earlier run (lower id) consumed *another* event.
    A run that consumed an event of no set (a new message, a task's event) is not extra, nor is one
    sharing the very event with an earlier run (that is the ``asset`` kind's overlap, not a copy)."""
    chain_of = {e: i for i, c in enumerate(chains) for e in c.event_ids}
    seen: dict[tuple[str, int], set[int]] = defaultdict(set)  # (DAG, set) -> events earlier runs consumed
    found: set[int] = set()
    for run in sorted({r.id: r for r in runs}.values(), key=lambda r: r.id):
        events = consumed.get(run.id, frozenset())
        if events and all(e in chain_of and seen[run.dag_id, chain_of[e]] - {e} for e in events):
            found.add(run.id)
        for e in events:
            if e in chain_of:
                seen[run.dag_id, chain_of[e]].add(e)
    return found

"""A new run's group, read from the REST API and judged by the same pure core as the database source.

The core compares runs by ``dag_run.id`` (the keep rule's "lowest id", the group key's first run).
The API never shows that id, but ``order_by=id`` sorts by it, so the runs of one DAG are numbered in
the order of one id-sorted list that covers all of them: every comparison the core makes (always
within one DAG) is then the database's. The numbers mean nothing outside one judgement; the one key
that contains an id (``partitioned-suspected|…|<lowest id>``) is rewritten with that run's run_id so
it stays the same across polls, restarts and replicas.

Siblings, as in ``sources/database/poll.py`` ``judge``: the same ``run_after`` (an id-sorted list of
the DAG over the candidates' run_after span), a shared consumed event (each event names the runs
that consumed it, whatever their run_after: the overlap race), and for a partitioned run the same
key within the suspect window. Followed for at most ``MAX_HOPS`` rounds: real groups are 2 or 3 runs.

Which new runs the daemon's poll reads further (``suspect``): reading a run's events costs Airflow a
request, so a run the tail's list already clears costs none. A non-partitioned duplicate either
shares its ``run_after`` with another run of its DAG (the exact pair), or has an *earlier* ``run_after`` than a run
of its DAG committed before it (the overlap race: the creators of one DAG's runs are serialised by its DagModel row
lock, so a run created from a stale snapshot after another run committed is the one out of order;
docs/explanation/airflow-internals.md, "The 3.0/3.1 race", ``core.detect``). Runs of one DAG made in the normal way
come in ``run_after`` order with distinct values, so neither holds and nothing is read.
A partitioned run is read only when its key repeats within the suspect window.
A run out of order without a race (a producer that committed its queue row late) is read and
judged like any other suspect: the filter only saves requests, the core still decides.

Not available through the API, so not used: ``asset_partition_dag_run`` rows (a suspected
partitioned group is never refined into a confirmed split or dropped as a re-processing, and split
partition keys are not reported), ``creating_job_id`` and the creator's hostname.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar, cast

from detector.airflowapi.client import Gone
from detector.core.decisions import decisions_from_notes, decisions_from_roles
from detector.core.detect import ALL_DAGS, DEFAULT_SUSPECT_WINDOW, DagFilter, find_duplicates
from detector.core.model import GUARD_NOTE_PREFIX, NO_DECISIONS, Decisions, Finding, Run, TaskProgress, asset_labels
from detector.core.trigger_event import find_trigger_event_duplicates
from detector.sources.api.copies import Near
from detector.sources.api.reader import ApiRun, ConsumedEvents, Reader, progress_of
from detector.sources.disputes import report_disputed

MAX_HOPS = 3
PARALLEL = 8  # requests of one judgement sent at once: one round trip for events, list and task instances
_GONE = object()
T = TypeVar("T")
R = TypeVar("R")
SUSPECTED_PARTITION = "partitioned-suspected|"
RunKey = tuple[str, str]
# Earlier roles (kept / duplicate) by (dag_id, run_id), from the ledger (``Ledger.decisions``).
Roles = Callable[[list[RunKey]], dict[RunKey, set[str]]]


@dataclass
class Verdict:
    """What one judgement found, and the runs it could not judge yet."""

    findings: list[Finding] = field(default_factory=list)
    waiting: list[ApiRun] = field(default_factory=list)  # events not readable yet: judge again later
    gone: list[ApiRun] = field(default_factory=list)  # deleted between the list and the read
    runs: dict[RunKey, Run] = field(default_factory=dict)  # every run judged, as the core saw it


def to_run(run: ApiRun, number: int) -> Run:
    return Run(
        id=number,
        dag_id=run.dag_id,
        run_id=run.run_id,
        run_type=run.run_type,
        run_after=run.run_after,
        state=run.state,
        partition_key=run.partition_key,
        queued_at=run.queued_at,
    )


class Judge:
    def __init__(
        self,
        reader: Reader,
        *,
        dag_filter: DagFilter = ALL_DAGS,
        suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
        roles: Roles | None = None,
        copies: bool = True,
    ) -> None:
        """``copies``: whether the Airflow watched can make new copies of a trigger's event
        (``trigger_event.copies_possible``); without, a run the list clears costs nothing more."""
        self.reader = reader
        self.copies = copies
        self.dag_filter = dag_filter
        self.suspect_window = suspect_window
        self.roles = roles

    def judge(
        self,
        new: Sequence[ApiRun],
        now: datetime,
        *,
        known: Mapping[RunKey, ApiRun] | None = None,
        known_from: datetime | None = None,
        order: Mapping[RunKey, int] | None = None,
    ) -> Verdict:
        """The groups ``new`` runs belong to. ``known``: every asset run with run_after >=
        ``known_from`` (the tail's last answer); ``order``: the id order (rank, lowest first) of the
        runs the tail listed in this poll. With both, only ``suspect`` runs are read further; without
        them (scan, a re-judgement) every run is."""
        verdict = Verdict()
        by_dag: dict[str, list[ApiRun]] = {}
        for run in new:
            if self.dag_filter.selects(run.dag_id):
                by_dag.setdefault(run.dag_id, []).append(run)
        neighbours: dict[str, list[ApiRun]] = {}
        for other in (known or {}).values():
            if other.dag_id in by_dag:
                neighbours.setdefault(other.dag_id, []).append(other)
        read: dict[RunKey, ConsumedEvents] = {}
        if known_from is not None and order is not None:
            picked = {
                d: [r for r in runs if suspect(r, neighbours.get(d, []), known_from, order, self.suspect_window)]
                for d, runs in by_dag.items()
            }
            cleared = [r for d, runs in by_dag.items() for r in runs if r not in picked[d]] if self.copies else []
            read = self._triggered(cleared, verdict)
            by_dag = {d: picked[d] + [r for r in by_dag[d] if _copied(read.get(r.key))] for d in by_dag}
        number = 0
        for dag_id in sorted(by_dag):
            if by_dag[dag_id]:
                number = self._judge_dag(
                    by_dag[dag_id], now, neighbours.get(dag_id, []), known_from, verdict, number, read
                )
        return verdict

    def _triggered(self, cleared: list[ApiRun], verdict: Verdict) -> dict[RunKey, ConsumedEvents]:
        """The events of the runs the list cleared (one round trip): those that consumed a trigger's
        event carrying a message id are judged (``_copied``): a copy of it may have made another run of
        the DAG (``core.trigger_event``) that neither the run_after nor a shared event shows. A cleared
        run not started yet waits: its events are unreadable until then (apache/airflow#71360). The
        others' events are kept for this judgement: a sibling's read is not sent twice."""
        found: dict[RunKey, ConsumedEvents] = {}
        for run, events in zip(cleared, self._parallel(self._events_or_gone, cleared), strict=True):
            if events is _GONE:
                verdict.gone.append(run)
            elif not isinstance(events, ConsumedEvents):
                verdict.waiting.append(run)
            else:
                found[run.key] = events
        return found

    def _judge_dag(
        self,
        new: list[ApiRun],
        now: datetime,
        same_dag: list[ApiRun],
        known_from: datetime | None,
        verdict: Verdict,
        number: int,
        read: Mapping[RunKey, ConsumedEvents],
    ) -> int:
        """``same_dag``: the DAG's runs from ``known``; ``read``: events already read (``_triggered``).
        One round trip first: the new runs' events, the DAG's id-ordered list over their span and, for
        a run whose exact twin (same run_after) is already listed, the task instances of both (that
        pair is nearly always a group). Runs whose events were read wait for their copies first."""
        if all(r.start_date is None for r in new):  # no event readable yet (apache/airflow#71360)
            verdict.waiting.extend(new)
            return number
        twins = [r for r in new if any(o.key != r.key and o.run_after == r.run_after for o in same_dag)]
        # (a run is not its own twin: ``same_dag`` lists the new runs too)
        twins += [
            o for o in same_dag if o not in twins and any(o.key != r.key and o.run_after == r.run_after for r in new)
        ]
        if any(r.start_date is None for r in twins):  # the group waits for it: read its tasks then
            twins = []
        unread = [r for r in new if r.key not in read]
        jobs: list[Callable[[], object]] = [functools.partial(self._events_or_gone, r) for r in unread]
        jobs += [functools.partial(self._list_or_gone, new)] if unread else []
        jobs += [functools.partial(self._tasks_or_none, r.key) for r in twins]
        answers = self._parallel(_call, jobs)
        first_list = answers[len(unread)] if unread else None
        tasks = {
            r.key: cast(list[dict[str, Any]] | None, a)
            for r, a in zip(twins, answers[len(unread) + bool(unread) :], strict=True)
        }
        events: dict[RunKey, ConsumedEvents] = {}
        candidates: dict[RunKey, ApiRun] = {}
        answered = dict(zip([r.key for r in unread], answers[: len(unread)], strict=True)) | dict(read)
        for run in new:
            found = answered[run.key]
            if found is _GONE:
                verdict.gone.append(run)
                continue
            if not isinstance(found, ConsumedEvents):
                verdict.waiting.append(run)
                continue
            events[run.key] = found
            candidates[run.key] = run
        if not candidates:
            return number
        near = Near(self.suspect_window)
        if not near.read(self.reader, (e for found in events.values() for e in found.triggers)):
            verdict.waiting.extend(candidates.values())  # a copy's consumer not started yet
            return number
        dag_id = new[0].dag_id
        # Only a run linked to no other can skip the list: its run_after is covered by ``known``
        # (no same-run_after sibling there), no event of it was consumed by another run of the DAG,
        # no two of its runs consumed copies of one message (one run holding every copy makes no
        # group), and it has no partition key (whose siblings lie within the suspect window).
        alone = len(near.runs_of(dag_id)) < 2 and all(
            run.partition_key is None
            and known_from is not None
            and run.run_after >= known_from
            and not any(o.run_after == run.run_after and o.key != run.key for o in same_dag)
            and all(c == run.key or c[0] != run.dag_id for c in events[run.key].consumers)
            for run in candidates.values()
        )
        if alone:
            return number
        listed: list[ApiRun] = []
        for hop in range(MAX_HOPS + 1):
            # The first hop's candidates are new runs, whose span the list read with their events covers.
            fresh = first_list if hop == 0 and first_list is not None else self._list_or_gone(list(candidates.values()))
            if fresh is _GONE:  # the DAG itself is gone (deleted, or no longer parsed): nothing left to act on
                verdict.gone.extend(r for r in new if r.key in events)
                return number
            listed = cast(list[ApiRun], fresh)
            by_key = {r.key: r for r in listed}
            grown = False
            for run in listed:
                if run.key not in candidates and self._linked(run, candidates.values()):
                    candidates[run.key] = run
                    grown = True
            for key, run in list(candidates.items()):
                if key in events:
                    continue
                try:
                    found = read.get(key) or self.reader.events(run)
                except Gone:
                    del candidates[key]
                    continue
                if found is None:  # a sibling Airflow has not started: judge the whole group later
                    verdict.waiting.extend(r for r in new if r.key in events)
                    return number
                events[key] = found
            # Copies are looked up for the new runs' trigger events only, as the database source does
            # (sources/database/copies.near_runs): a copy's consumer is a sibling, not a new root.
            linked = {c for found in events.values() for c in found.consumers if c[0] == dag_id} | near.runs_of(dag_id)
            for consumer in linked - candidates.keys():
                other = by_key.get(consumer) or self.reader.run(*consumer)
                if other is not None:
                    candidates[consumer] = other
                    grown = True
            if not grown:
                break
        order = {r.key: i for i, r in enumerate(listed)}
        present = sorted((k for k in candidates if k in order), key=order.__getitem__)
        runs = {key: to_run(candidates[key], number + 1 + i) for i, key in enumerate(present)}
        number += len(present) + 1
        verdict.runs.update(runs)
        if len(runs) < 2:
            return number
        by_id = {run.id: key for key, run in runs.items()}
        run_events = {runs[k].id: events[k].event_ids for k in runs if k in events}
        progress = self._progress(candidates, runs, now, tasks)
        prior = self._prior(candidates, runs, progress)
        findings = find_duplicates(
            runs.values(),
            run_events,
            progress,
            dag_filter=self.dag_filter,
            suspect_window=self.suspect_window,
            prior=prior,
        )
        if near.found:  # the trigger_event kind, beside the groups of other kinds (their kept runs anchor it)
            findings += find_trigger_event_duplicates(
                runs.values(),
                run_events,
                near.copies(),
                progress,
                dag_filter=self.dag_filter,
                prior=prior,
                beside=findings,
            )
        new_keys = {r.key for r in new}
        for finding in findings:
            if any(by_id[r.id] in new_keys for r in finding.runs):
                consumed = (events[by_id[r.id]] for r in finding.runs if by_id[r.id] in events)
                named = asset_labels(a for found in consumed for a in found.assets)
                verdict.findings.append(dataclasses.replace(_stable_key(finding, by_id), assets=named))
        return number

    def _linked(self, run: ApiRun, candidates: Iterable[ApiRun]) -> bool:
        """Same run_after (asset runs), or the same partition key within the suspect window."""
        for c in candidates:
            if c.partition_key is None and run.partition_key is None and c.run_after == run.run_after:
                return True
            if (
                c.partition_key is not None
                and c.partition_key == run.partition_key
                and abs(c.run_after - run.run_after) <= self.suspect_window
            ):
                return True
        return False

    def _list_span(self, candidates: Iterable[ApiRun]) -> list[ApiRun]:
        """The DAG's asset runs over the candidates' run_after span, in id order (one list, paged)."""
        runs = list(candidates)
        pad = self.suspect_window if any(r.partition_key is not None for r in runs) else timedelta(0)
        low = min(r.run_after for r in runs) - pad
        high = max(r.run_after for r in runs) + pad
        return self.reader.asset_runs(dag_id=runs[0].dag_id, run_after_gte=low, run_after_lte=high)

    def _progress(
        self,
        candidates: Mapping[RunKey, ApiRun],
        runs: Mapping[RunKey, Run],
        now: datetime,
        read: Mapping[RunKey, list[dict[str, Any]] | None],
    ) -> dict[int, TaskProgress]:
        """``read``: task instances already read in the judgement's first round trip."""
        missing = [k for k in runs if k not in read]
        fetched = dict(read) | dict(zip(missing, self._parallel(self._tasks_or_none, missing), strict=True))
        progress: dict[int, TaskProgress] = {}
        for key, run in runs.items():
            tasks = fetched[key]
            if tasks:
                guarded = (candidates[key].note or "").startswith(GUARD_NOTE_PREFIX)
                progress[run.id] = progress_of(tasks, now, guarded=guarded)
        return progress

    def _events_or_gone(self, run: ApiRun) -> ConsumedEvents | object | None:
        try:
            return self.reader.events(run)
        except Gone:
            return _GONE

    def _list_or_gone(self, candidates: list[ApiRun]) -> list[ApiRun] | object:
        try:
            return self._list_span(candidates)
        except Gone:
            return _GONE

    def _tasks_or_none(self, key: RunKey) -> list[dict[str, Any]] | None:
        try:
            return self.reader.task_states(*key)
        except Gone:
            return None

    def _parallel(self, call: Callable[[T], R], items: Sequence[T]) -> list[R]:
        """One request per item, sent together (a group's runs): one round trip instead of several."""
        if len(items) < 2:
            return [call(i) for i in items]
        with ThreadPoolExecutor(max_workers=min(PARALLEL, len(items))) as pool:
            return list(pool.map(call, items))

    def _prior(
        self, candidates: Mapping[RunKey, ApiRun], runs: Mapping[RunKey, Run], progress: Mapping[int, TaskProgress]
    ) -> Decisions:
        notes = {run.id: note for key, run in runs.items() if (note := candidates[key].note)}
        roles = decisions_from_roles(runs.values(), self.roles(list(runs))) if self.roles is not None else NO_DECISIONS
        prior = decisions_from_notes(runs.values(), notes, progress, ledger_kept=roles.kept) | roles
        report_disputed(prior, runs.values(), notes)
        return prior


def suspect(
    run: ApiRun,
    same_dag: Iterable[ApiRun],
    known_from: datetime,
    order: Mapping[RunKey, int],
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
) -> bool:
    """Whether the tail's answer leaves ``run`` possibly part of a group (module docstring): it is
    not a run the tail listed in this poll (a waiting or late run), it lies before the window, or
    another run of its DAG has its ``run_after``, or a later ``run_after`` and a lower id. A run
    listed in an earlier poll has no rank here and counts as the lower id (commits of one DAG come
    in id order), which errs towards reading. A partitioned run (3.2+) is grouped only with runs of
    its partition key within the suspect window (``core.detect``): it is read when such a run is
    listed, or when the window does not reach back that far."""
    if run.key not in order or run.run_after < known_from:
        return True
    others = [o for o in same_dag if o.key != run.key]
    if run.partition_key is not None:
        if run.run_after - suspect_window < known_from:
            return True
        return any(
            o.partition_key == run.partition_key and abs(o.run_after - run.run_after) <= suspect_window for o in others
        )
    rank = order[run.key]
    for other in others:
        if other.run_after == run.run_after:
            return True
        if other.run_after > run.run_after and order.get(other.key, -1) < rank:
            return True
    return False


def _copied(events: ConsumedEvents | None) -> bool:
    """Whether a run consumed a trigger's event with a message id (the only proof of a copy)."""
    return events is not None and any(e.message_ids for e in events.triggers)


def _call(job: Callable[[], T]) -> T:
    return job()


def _stable_key(finding: Finding, by_id: Mapping[int, RunKey]) -> Finding:
    """A suspected partitioned group's key ends with its lowest run id: use that run's run_id."""
    if not finding.key.startswith(SUSPECTED_PARTITION):
        return finding
    head, _, number = finding.key.rpartition("|")
    return dataclasses.replace(finding, key=f"{head}|{by_id[int(number)][1]}")

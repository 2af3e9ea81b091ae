"""``dupguard scan --source api``: the history audit through the REST API.

Candidates are found with list calls only (100 runs or events per request): runs of one DAG with
the same ``run_after`` or the same partition key, from the list of asset runs in range; runs of one
DAG that consumed the same event (the overlap race: another run_after), from the list of asset
events. Only candidates are then judged (``judge.Judge``: their events, task instances and notes,
one id-ordered list per group), so the cost is about (runs + events) / 100 requests plus a few per
candidate, not one per run.

Runs of one DAG that consumed different copies of one message (the ``trigger_event`` kind, proven
by a message id: ``core.trigger_event``) are found in the same list of events: each event comes with
its ``extra``, ``source_dag_id`` and consumers.

Events are listed from ``EVENT_SLACK`` before ``since``: a shared event is older than both runs.
Events Airflow cannot serialise (a consumer not started yet, apache/airflow#71360) are skipped and
counted; such a run cannot be judged through the API until it starts.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from detector.core.detect import ALL_DAGS, DEFAULT_SUSPECT_WINDOW, DagFilter
from detector.core.model import Finding
from detector.core.trigger_event import TriggerEvent
from detector.sources.api.copies import proven_sets
from detector.sources.api.judge import Judge, RunKey
from detector.sources.api.reader import ApiRun, Reader

EVENT_SLACK = timedelta(hours=1)
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ApiScan:
    findings: list[Finding]
    runs_examined: int
    waiting: int  # candidate runs whose events Airflow cannot serve yet (not started)
    unreadable_events: int


def scan_api(
    reader: Reader,
    *,
    now: datetime,
    since: datetime | None,
    dag_filter: DagFilter = ALL_DAGS,
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
    progress: Progress | None = None,
) -> ApiScan:
    runs = {r.key: r for r in reader.asset_runs(run_after_gte=since) if dag_filter.selects(r.dag_id)}
    clusters = _Clusters()
    by_trigger: dict[tuple[str, datetime], list[RunKey]] = defaultdict(list)
    by_partition: dict[tuple[str, str], list[ApiRun]] = defaultdict(list)
    for run in runs.values():
        if run.partition_key is None:
            by_trigger[(run.dag_id, run.run_after)].append(run.key)
        else:
            by_partition[(run.dag_id, run.partition_key)].append(run)
    for keys in by_trigger.values():
        if len(keys) > 1:
            clusters.join(keys)
    for group in by_partition.values():
        group.sort(key=lambda r: r.run_after)
        for a, b in itertools.pairwise(group):
            if b.run_after - a.run_after <= suspect_window:
                clusters.join([a.key, b.key])
    triggers: list[TriggerEvent] = []
    consumers, unreadable = reader.event_consumers(
        since=None if since is None else since - EVENT_SLACK, triggers=triggers
    )
    for copied in proven_sets(triggers, consumers, suspect_window):
        if len(linked := sorted(k for k in copied if k in runs)) > 1:
            clusters.join(linked)
    for consumed_by in consumers.values():
        per_dag: dict[str, list[RunKey]] = defaultdict(list)
        for key in consumed_by:
            if key in runs:
                per_dag[key[0]].append(key)
        for same in per_dag.values():
            if len(same) > 1:
                clusters.join(same)
    judge = Judge(reader, dag_filter=dag_filter, suspect_window=suspect_window)
    findings: dict[str, Finding] = {}
    examined: set[RunKey] = set()
    waiting = 0
    groups = clusters.groups()
    for done, keys in enumerate(groups, start=1):
        verdict = judge.judge([runs[k] for k in keys], now)
        examined.update(verdict.runs)
        waiting += len(verdict.waiting)
        for finding in verdict.findings:
            findings.setdefault(finding.key, finding)
        if progress is not None:
            progress(done, len(groups))
    ordered = sorted(findings.values(), key=lambda f: (f.dag_id, f.run_after, f.key))
    return ApiScan(ordered, len(examined), waiting, unreadable)


class _Clusters:
    """Union-find over run keys: candidate runs that may belong to one group are judged together."""

    def __init__(self) -> None:
        self.parent: dict[RunKey, RunKey] = {}

    def _root(self, key: RunKey) -> RunKey:
        self.parent.setdefault(key, key)
        while self.parent[key] != key:
            self.parent[key] = self.parent[self.parent[key]]
            key = self.parent[key]
        return key

    def join(self, keys: list[RunKey]) -> None:
        first = self._root(keys[0])
        for key in keys[1:]:
            root = self._root(key)
            if root != first:
                self.parent[root] = first

    def groups(self) -> list[list[RunKey]]:
        members: dict[RunKey, list[RunKey]] = defaultdict(list)
        for key in self.parent:
            members[self._root(key)].append(key)
        return [sorted(g) for g in members.values()]

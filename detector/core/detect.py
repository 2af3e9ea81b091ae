"""The pure detection core: runs, their consumed events and task progress in; findings out.

No clock, no environment, no I/O. The same function serves the one-shot history scan and the
daemon's incremental poll, which passes only the neighbourhood of newly seen runs.

Why these rules (see docs/explanation/airflow-internals.md, "How asset-triggered runs are created"):
- 3.0/3.1 (apache/airflow#54491, #63507): the second scheduler acts on a stale, unlocked read of
  ``asset_dag_run_queue`` and creates a run with the *same* ``run_after`` (max queue created_at) and
  the *same* consumed events -- or, when its stale snapshot is *older* than the first scheduler's
  (a DAG on ``a1 | a2``: B read only a1's row, A read both), a run with an *earlier* ``run_after``
  that consumes some of the first run's events again. Non-partitioned asset runs of one DAG are
  therefore linked when they share ``run_after`` or a consumed event; a group is a connected set.
  Legitimate runs of one DAG never share an event: each run consumes the events in
  ``(max(run_after) of the DAG's earlier asset runs, its own run_after]``
  (``_create_dag_runs_asset_triggered``: 3.0.6 scheduler_job_runner.py L1633-1653, 3.1.2 L1679-1707,
  3.2.2 L2162-2191, 3.3.2 L2600-2641), windows that do not overlap as long as runs are created in
  ``run_after`` order -- which the stale read breaks. Partitioned runs are not linked by events: one
  event legitimately maps to several partition keys of one DAG (3.2.2 airflow/assets/manager.py
  L431-467: a mapper's ``to_downstream`` may return several keys, each gets its own run).
  A group is ``confirmed`` when every run consumed events and one run consumed every event of the
  group: that run is kept, so stopping the others leaves no event unprocessed. Otherwise (disjoint
  events under one run_after, a partial overlap, a run without events) it is only ``suspected``.
  A producer transaction that commits its queue row after a later run was made also breaks the
  order (no race): that run then holds the late event, which no other run has, so it is kept out of
  ``confirmed`` by the same rule.
- 3.2 partitioned path (apache/airflow#68045): two schedulers read the same pending
  ``asset_partition_dag_run``; each stamps its own ``utcnow()`` as run_after, so the key is
  ``(dag_id, partition_key)`` and identical, non-empty event sets confirm it. Runs of one partition
  with different events created close together are only *suspected*: a partition legitimately
  re-runs when new data for it arrives.
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from detector.core.model import (
    ASSET_TRIGGERED,
    NO_DECISIONS,
    NO_PROGRESS,
    Confidence,
    Decisions,
    Finding,
    Kind,
    Run,
    TaskProgress,
)

DEFAULT_SUSPECT_WINDOW = timedelta(seconds=60)


@dataclass(frozen=True, slots=True)
class DagFilter:
    """Include/exclude globs on dag_id. An empty include list means every DAG."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def selects(self, dag_id: str) -> bool:
        if self.include and not any(fnmatch.fnmatchcase(dag_id, g) for g in self.include):
            return False
        return not any(fnmatch.fnmatchcase(dag_id, g) for g in self.exclude)


ALL_DAGS = DagFilter()


def keep_order(run: Run, progress: Mapping[int, TaskProgress], prior: Decisions = NO_DECISIONS) -> tuple[int, int, int]:
    """Sort key of the keep rule; the first run of a group is kept.

    1. a run an earlier judgement kept stays kept (a decision is final);
    2. a run that was stopped, chosen as a duplicate, or made skipped by the in-scheduler guard (its
       note) is never kept, whatever its tasks did: stopping a duplicate whose task was starting
       leaves a *failed* task instance, which must not make it look like the run that did the work;
       and the guard keeps the run committed first, which can have the higher id (docs/how-to/guard.md);
    3. among the others a run whose tasks started wins, then the lowest id.

    Deterministic from database state (runs, task instances, notes) and the ledger, so every replica
    and every restart picks the same run.
    """
    if run.id in prior.kept:
        return (0, 0, run.id)
    p = progress.get(run.id, NO_PROGRESS)
    if prior.excluded(run.id) or p.guarded:
        return (2, 0, run.id)
    return (1, 0 if p.any_started else 1, run.id)


def find_duplicates(
    runs: Iterable[Run],
    events: Mapping[int, frozenset[int]],
    progress: Mapping[int, TaskProgress] | None = None,
    *,
    dag_filter: DagFilter = ALL_DAGS,
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
    prior: Decisions = NO_DECISIONS,
) -> list[Finding]:
    """Every duplicate group among ``runs``.

    ``events`` maps run id to the ids of the asset events it consumed; ``progress`` maps run id to
    its task progress (missing means nothing started); ``prior`` holds earlier keep decisions
    (``keep_order``). Runs that are not asset-triggered or not
    selected by ``dag_filter`` are ignored. Findings come sorted by (dag_id, run_after, key).
    """
    progress = progress or {}
    unique = {r.id: r for r in runs if r.run_type == ASSET_TRIGGERED and dag_filter.selects(r.dag_id)}
    asset_runs: dict[str, list[Run]] = defaultdict(list)
    by_partition: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in unique.values():
        if run.partition_key is None:
            asset_runs[run.dag_id].append(run)
        else:
            by_partition[(run.dag_id, run.partition_key)].append(run)

    findings: list[Finding] = []
    for dag_runs in asset_runs.values():
        for group in _linked_groups(dag_runs, events):
            findings.append(_asset_finding(group, events, progress, prior))
    for group in by_partition.values():
        if len(group) > 1:
            findings.extend(_partition_findings(group, events, progress, suspect_window, prior))
    findings.sort(key=lambda f: (f.dag_id, f.run_after, f.key))
    return findings


def _event_set(run: Run, events: Mapping[int, frozenset[int]]) -> frozenset[int]:
    return events.get(run.id, frozenset())


def _linked_groups(dag_runs: Sequence[Run], events: Mapping[int, frozenset[int]]) -> list[list[Run]]:
    """Connected sets (>= 2 runs, by id) of one DAG's runs linked by a shared run_after or event."""
    marks = {r.id: {("run_after", r.run_after), *(("event", e) for e in _event_set(r, events))} for r in dag_runs}
    return linked_sets(dag_runs, marks)


def linked_sets(runs: Sequence[Run], marks: Mapping[int, Iterable[object]]) -> list[list[Run]]:
    """Connected sets (>= 2 runs, each sorted by id) of ``runs`` linked by a shared mark (``marks``:
    run id -> its marks; a mark held by one run links nothing)."""
    parent = {r.id: r.id for r in runs}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def link(a: int, b: int) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    first_with: dict[object, int] = {}
    for run in sorted(runs, key=lambda r: r.id):
        for mark in marks.get(run.id, ()):
            if mark in first_with:
                link(first_with[mark], run.id)
            else:
                first_with[mark] = run.id
    members: dict[int, list[Run]] = defaultdict(list)
    for run in runs:
        members[root(run.id)].append(run)
    return [sorted(g, key=lambda r: r.id) for g in members.values() if len(g) > 1]


def _asset_finding(
    group: list[Run],
    events: Mapping[int, frozenset[int]],
    progress: Mapping[int, TaskProgress],
    prior: Decisions,
) -> Finding:
    sets = {r.id: _event_set(r, events) for r in group}
    consumed = frozenset().union(*sets.values())
    # Only a run that consumed every event of the group may be kept: stopping the others then leaves
    # no event without a run. Without such a run (or with a run that consumed nothing) no stop is safe.
    covering = frozenset(r.id for r in group if sets[r.id] == consumed)
    confirmed = bool(covering) and all(sets.values())
    counts = Counter(e for s in sets.values() for e in s)
    shared = frozenset(e for e, n in counts.items() if n > 1)
    # The lowest id is the run committed first (the DagModel row lock serialises the creators), so it
    # never changes as the group grows, and its run_after is the one key of an exact pair (as before).
    first = min(group, key=lambda r: r.id)
    return finding(
        key=f"asset|{first.dag_id}|{first.run_after.isoformat()}",
        kind=Kind.ASSET,
        confidence=Confidence.CONFIRMED if confirmed else Confidence.SUSPECTED,
        group=group,
        shared=shared,
        progress=progress,
        prior=prior,
        preferred=covering,
    )


def _partition_findings(
    group: list[Run],
    events: Mapping[int, frozenset[int]],
    progress: Mapping[int, TaskProgress],
    window: timedelta,
    prior: Decisions,
) -> list[Finding]:
    dag_id, partition_key = group[0].dag_id, group[0].partition_key
    by_events: dict[frozenset[int], list[Run]] = defaultdict(list)
    for run in group:
        by_events[_event_set(run, events)].append(run)

    findings: list[Finding] = []
    # One representative per distinct event set: the kept run of a confirmed class stands for it, so
    # a suspected group never repeats runs that a confirmed group already accounts for.
    representatives: list[Run] = []
    for event_set, members in by_events.items():
        members.sort(key=lambda r: keep_order(r, progress, prior))
        representatives.append(members[0])
        if len(members) > 1 and event_set:
            digest = hashlib.sha256(",".join(map(str, sorted(event_set))).encode()).hexdigest()[:16]
            findings.append(
                finding(
                    key=f"partitioned|{dag_id}|{partition_key}|{digest}",
                    kind=Kind.PARTITIONED,
                    confidence=Confidence.CONFIRMED,
                    group=members,
                    shared=event_set,
                    progress=progress,
                    prior=prior,
                )
            )
        elif len(members) > 1:
            representatives.extend(members[1:])

    for cluster in _clusters_within(representatives, window):
        if len(cluster) > 1:
            shared = frozenset.intersection(*(_event_set(r, events) for r in cluster))
            findings.append(
                finding(
                    key=f"partitioned-suspected|{dag_id}|{partition_key}|{min(r.id for r in cluster)}",
                    kind=Kind.PARTITIONED,
                    confidence=Confidence.SUSPECTED,
                    group=cluster,
                    shared=shared,
                    progress=progress,
                    prior=prior,
                )
            )
    return findings


def _clusters_within(runs: Sequence[Run], window: timedelta) -> list[list[Run]]:
    """Chains of runs whose consecutive run_after values lie within ``window`` of each other."""
    clusters: list[list[Run]] = []
    for run in sorted(runs, key=lambda r: (r.run_after, r.id)):
        if clusters and run.run_after - clusters[-1][-1].run_after <= window:
            clusters[-1].append(run)
        else:
            clusters.append([run])
    return clusters


def finding(
    *,
    key: str,
    kind: Kind,
    confidence: Confidence,
    group: Sequence[Run],
    shared: frozenset[int],
    progress: Mapping[int, TaskProgress],
    prior: Decisions,
    preferred: frozenset[int] | None = None,
) -> Finding:
    """``preferred``: the only runs that may be kept when not every run may be (None: every run).

    It comes before an earlier decision: keeping a run that did not consume every event would let
    stopping the others lose an event. A run an earlier decision kept that is not kept now is still
    never remediated (``plan``: ``kept_before``)."""
    ids = frozenset(r.id for r in group)
    ordered = sorted(
        group, key=lambda r: (preferred is not None and r.id not in preferred, keep_order(r, progress, prior))
    )
    kept, duplicates = ordered[0], tuple(sorted(ordered[1:], key=lambda r: r.id))
    return Finding(
        key=key,
        kind=kind,
        confidence=confidence,
        dag_id=kept.dag_id,
        kept=kept,
        duplicates=duplicates,
        shared_event_ids=tuple(sorted(shared)),
        run_after=min(r.run_after for r in group),
        partition_key=kept.partition_key,
        duplicate_task_seconds=sum(progress.get(r.id, NO_PROGRESS).task_seconds for r in duplicates),
        progress={r.id: progress.get(r.id, NO_PROGRESS) for r in group},
        prior=Decisions(stopped=prior.stopped & ids, duplicates=prior.duplicates & ids, kept=prior.kept & ids),
    )

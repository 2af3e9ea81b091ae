"""Legitimate re-processing of a partition key, told from a race by what Airflow recorded.

Pure: findings and ``asset_partition_dag_run`` rows in, findings out.

``detect.find_duplicates`` marks runs of one (DAG, partition key) created within the suspect
window with *different* consumed events as ``suspected``. On a clean Airflow 3.3.2 that also
happens when a producer legitimately re-processes a key seconds later (fixture
``partition_rerun``). Airflow records the difference (docs/explanation/airflow-internals.md, "A partition key split into
two pending rows"):

- each partitioned run is made from its own ``asset_partition_dag_run`` row
  (``created_dag_run_id`` points at it), created when the first event for the key arrived;
- ``_get_or_create_apdr`` (airflow/assets/manager.py) reuses the newest pending row, so a second
  row for the key is created either after the first row already had its run (re-processing), or
  while it was still pending (the split of apache/airflow#71070, which then makes one run per row).

So for two runs ``a`` (made first) and ``b`` with their own rows: ``b``'s row created after ``a`` was created
(``run_after`` of a partitioned run is its creation time, docs/explanation/airflow-internals.md, "Partitioned runs
(3.2+)") means the rows' pending periods never overlapped: a re-processing, not reported. Overlapping periods mean
the split: the runs are a duplicate group, ``confirmed`` (both producers had finished the key before the first run
was made, and Airflow without the split makes one run of both events). A run without its own row (3.2's race loser,
whose row was overwritten) cannot be cleared and stays ``suspected``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import timedelta

from detector.core.detect import DEFAULT_SUSPECT_WINDOW, find_duplicates
from detector.core.model import Confidence, Finding, Kind, PartitionRow, Run, TaskProgress


def needs_origins(finding: Finding) -> bool:
    """Whether ``refine_partitioned`` would look at this finding's rows (a suspected partitioned group)."""
    return finding.kind is Kind.PARTITIONED and finding.confidence is Confidence.SUSPECTED


def _overlap(a: Run, b: Run, origins: Mapping[int, PartitionRow]) -> bool | None:
    """True if the two runs' rows were pending at the same time, False if not, None if unknown."""
    first, second = sorted((a, b), key=lambda r: (r.run_after, r.id))
    row_first, row_second = origins.get(first.id), origins.get(second.id)
    if row_first is None or row_second is None or row_first.id == row_second.id:
        return None
    return row_second.created_at < first.run_after


def _linked(runs: Sequence[Run], origins: Mapping[int, PartitionRow]) -> tuple[list[list[Run]], set[int]]:
    """Runs grouped by "not provably one after the other" (union-find), and the runs of unjudgeable pairs."""
    parent = {r.id: r.id for r in runs}
    unknown: set[int] = set()

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            verdict = _overlap(a, b, origins)
            if verdict is False:
                continue
            parent[root(b.id)] = root(a.id)
            if verdict is None:
                unknown.update((a.id, b.id))
    components: dict[int, list[Run]] = {}
    for run in runs:
        components.setdefault(root(run.id), []).append(run)
    return list(components.values()), unknown


def refine_partitioned(
    findings: Sequence[Finding],
    origins: Mapping[int, PartitionRow],
    events: Mapping[int, frozenset[int]],
    progress: Mapping[int, TaskProgress] | None = None,
    *,
    suspect_window: timedelta = DEFAULT_SUSPECT_WINDOW,
) -> list[Finding]:
    """``findings`` with each suspected partitioned group judged by its runs' own rows.

    ``origins`` maps run id to the row whose ``created_dag_run_id`` is that run. Runs linked by an
    overlap (or by a pair that cannot be judged) stay together; a group whose links are all
    overlaps becomes ``confirmed``; runs linked to nothing are dropped (legitimate re-processing).
    """
    out: list[Finding] = []
    for finding in findings:
        if not needs_origins(finding):
            out.append(finding)
            continue
        runs = sorted(finding.runs, key=lambda r: r.id)
        components, unknown = _linked(runs, origins)
        for members in components:
            if len(members) < 2:
                continue
            if len(members) == len(runs):
                judged = finding
            else:
                regrouped = find_duplicates(
                    members, events, progress, suspect_window=suspect_window, prior=finding.prior
                )
                if len(regrouped) != 1:  # cannot happen for runs of one suspected group; keep what we had
                    out.append(finding)
                    break
                judged = regrouped[0]
            if not unknown.intersection(r.id for r in members):
                judged = dataclasses.replace(
                    judged,
                    key=f"partitioned-split|{finding.dag_id}|{finding.partition_key}|{min(r.id for r in members)}",
                    confidence=Confidence.CONFIRMED,
                )
            out.append(judged)
    return out

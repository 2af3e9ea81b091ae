"""Is this deployment at risk of duplicate runs, and does something stop them (``dupguard doctor``)?

Pure judgement of what the doctor read (docs/reference/doctor.md). Which code paths can duplicate is a
property of the Airflow release, read in the released wheels (docs/explanation/airflow-internals.md, "Which
releases carry which fix"):

- asset-triggered runs (apache/airflow#54491, #63507): every 3.0.x and 3.1.x; fixed in 3.2.0
  (the scheduler re-selects the queue rows FOR UPDATE SKIP LOCKED); the 3.1 backport came after
  3.1.8, the last 3.1 release;
- partitioned runs (#68045): every 3.2.x; fixed in 3.3.0 (row locks on asset_partition_dag_run);
- one partition key split into two pending rows (#71070): 3.2.x and 3.3.x, open as of 3.3.2 (the
  newest release read); a later release is "unknown", never assumed fixed.

Airflow 2 has none of them (UNIQUE(dag_id, execution_date) and a deterministic run_id).
A version-affected path is *at risk* when the deployment uses it: two creators (schedulers alive)
and DAGs of that kind, or duplicates of that kind found recently. A split needs no second
scheduler (two event registrations race), only a partitioned DAG fed by two or more assets.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

NEWEST_CHECKED = (3, 3, 2)


class PathName(enum.StrEnum):
    ASSET = "asset_triggered"
    PARTITIONED = "partitioned"
    SPLIT = "split_partition"


class Status(enum.StrEnum):
    NOT_AFFECTED = "not_affected"  # this release has no such race
    NOT_EXPOSED = "not_exposed"  # the release has it, this deployment does not use it (now)
    AT_RISK = "at_risk"
    UNKNOWN = "unknown"  # the release has it; what the deployment uses could not be read


ISSUES = {
    PathName.ASSET: ("apache/airflow#54491", "apache/airflow#63507"),
    PathName.PARTITIONED: ("apache/airflow#68045",),
    PathName.SPLIT: ("apache/airflow#71070",),
}


@dataclass(frozen=True)
class Observed:
    """What the doctor read; None where it could not be read (no grant, the REST source)."""

    version: str  # "3.1.2", or the alembic head's range ">=3.1.0,<3.1.8", or "3.1 (inferred …)"
    schedulers_alive: int | None = None
    asset_dags: int | None = None  # DAGs scheduled on assets (and aliases)
    partitioned_dags: int | None = None
    multi_asset_partitioned_dags: int | None = None  # partitioned DAGs scheduled on 2+ assets
    asset_groups_found: int | None = None  # duplicate groups in the look-back, by kind
    partitioned_groups_found: int | None = None
    splits_found: int | None = None
    guard_notes: int | None = None  # runs the in-scheduler guard stopped in the look-back
    remediation_acts: bool = False  # mode fail/skip and every check of its backend passed
    triggerers_alive: int | None = None
    checks_on: tuple[str, ...] = ()  # the periodic checks `run` would run here (detector.checks)


@dataclass(frozen=True)
class PathRisk:
    name: PathName
    issues: tuple[str, ...]
    affected: bool | None  # by the release: None when newer than the releases read
    status: Status
    protected: bool
    why: str


def parse_version(text: str) -> tuple[int, int, int | None] | None:
    """(major, minor, patch) of the first version in ``text``; patch None when only major.minor is known."""
    match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    if match is None:
        return None
    patch = match.group(3)
    return int(match.group(1)), int(match.group(2)), None if patch is None else int(patch)


def release_affected(name: PathName, version: tuple[int, int, int | None]) -> tuple[bool | None, str]:
    """Whether the release has the race on path ``name`` (None: newer than the releases read), and why."""
    major, minor, patch = version
    line = (major, minor)
    if major < 3:
        return False, "Airflow 2: UNIQUE(dag_id, execution_date) and a deterministic run_id prevent it"
    if name is PathName.ASSET:
        if line <= (3, 1):
            return True, "every 3.0.x and 3.1.x release reads the queue without a lock (fixed in 3.2.0)"
        return False, "fixed in 3.2.0 (queue rows re-selected FOR UPDATE SKIP LOCKED)"
    if line < (3, 2):
        return False, "no partitioned assets before 3.2"
    if name is PathName.PARTITIONED:
        if line == (3, 2):
            return True, "every 3.2.x release reads pending partition rows without a lock (fixed in 3.3.0)"
        return False, "fixed in 3.3.0 (row locks on asset_partition_dag_run)"
    newer = line > NEWEST_CHECKED[:2] or (line == NEWEST_CHECKED[:2] and (patch or 0) > NEWEST_CHECKED[2])
    if newer:
        return (
            None,
            "open as of 3.3.2; this release is newer than the releases read "
            "(docs/explanation/airflow-internals.md#9-which-releases-carry-which-fix)",
        )
    return True, "open in every 3.2.x and 3.3.x release up to 3.3.2 (fix proposed in apache/airflow PR 71074)"


def _exposure(name: PathName, seen: Observed) -> tuple[bool | None, str]:
    """Whether this deployment uses path ``name`` (None: unknown), and why."""
    if name is PathName.SPLIT:
        found, dags = seen.splits_found, seen.multi_asset_partitioned_dags
        if found:
            return True, f"{found} split partition key(s) found"
        if dags is None:
            return None, "partitioned DAGs fed by 2+ assets: unknown"
        return dags > 0, f"{dags} partitioned DAG(s) scheduled on 2+ assets"
    found = seen.asset_groups_found if name is PathName.ASSET else seen.partitioned_groups_found
    dags = seen.asset_dags if name is PathName.ASSET else seen.partitioned_dags
    kind = "asset-scheduled" if name is PathName.ASSET else "partitioned"
    if found:
        return True, f"{found} duplicate group(s) found"
    if dags is None or seen.schedulers_alive is None:
        return None, f"{kind} DAGs or schedulers alive: unknown"
    why = f"{dags} {kind} DAG(s), {seen.schedulers_alive} scheduler(s) alive"
    return dags > 0 and seen.schedulers_alive >= 2, why


def assess(seen: Observed) -> list[PathRisk]:
    """One verdict per code path. Protection: the guard (its notes seen) or a remediation that can
    act stops asset and partitioned duplicates; nothing stops a split (dupguard only reports it)."""
    version = parse_version(seen.version)
    out = []
    for name in PathName:
        if version is None:
            affected, why = None, f"Airflow version {seen.version!r} not understood"
        else:
            affected, why = release_affected(name, version)
        protected = name is not PathName.SPLIT and (bool(seen.guard_notes) or seen.remediation_acts)
        if affected is False:
            status = Status.NOT_AFFECTED
        else:
            exposed, how = _exposure(name, seen)
            why = f"{why}; {how}"
            if exposed is None or (affected is None and exposed):
                status = Status.UNKNOWN
            else:
                status = Status.AT_RISK if exposed else Status.NOT_EXPOSED
        out.append(PathRisk(name, ISSUES[name], affected, status, protected, why))
    return out


def unprotected(risks: list[PathRisk]) -> list[PathRisk]:
    """The paths that make ``doctor`` exit 1: at risk, or not ruled out (unknown), and unprotected."""
    return [r for r in risks if r.status in (Status.AT_RISK, Status.UNKNOWN) and not r.protected]


# --- the rest of the HA family (docs/explanation/checks.md): named by the doctor, watched by the periodic checks ---
# Nothing here changes the exit code: dupguard only detects and alerts on these (except the opt-in repair of
# stranded events), so "protected" would claim too much. Versions read in the released wheels
# (docs/explanation/airflow-internals.md, the sections of each kind).

FAMILY_ISSUES = {
    "trigger_flapping": ("apache/airflow#65792", "apache/airflow#72848"),
    "stranded_events": ("apache/airflow#56050",),
    "double_bump": ("apache/airflow#57618",),
}


@dataclass(frozen=True)
class FamilyRisk:
    name: str  # the periodic check's kind that watches for it
    issues: tuple[str, ...]
    affected: bool | None
    status: Status
    watched: bool  # the check runs in this configuration
    why: str


def family_affected(name: str, version: tuple[int, int, int | None]) -> tuple[bool | None, str]:
    major, minor, patch = version
    line, at = (major, minor), (major, minor, patch or 0)
    if major < 3:
        return False, "Airflow 2: not this code"
    if at > NEWEST_CHECKED:
        return None, "newer than the releases read (3.3.2)"
    if name == "trigger_flapping":
        if at < (3, 2, 2):
            return (
                True,
                "asset triggers are claimed without the alive-owner filter before 3.2.2 (callback triggers too)",
            )
        return True, "callback (deadline) triggers are claimed without the alive-owner filter up to 3.3.2"
    if name == "double_bump":
        if line <= (3, 1):
            return True, "schedule_tis bumps try_number with no state guard in 3.0.x and 3.1.x (fixed in 3.2.0)"
        return False, "fixed in 3.2.0 (schedule_tis guards the state)"
    return True, "open in every 3.0.x-3.3.x release up to 3.3.2 (ON CONFLICT DO NOTHING keeps the first event's time)"


def _family_exposure(name: str, seen: Observed) -> tuple[bool | None, str]:
    if name == "trigger_flapping":
        if seen.triggerers_alive is None:
            return None, "triggerers alive: unknown"
        return seen.triggerers_alive >= 2, f"{seen.triggerers_alive} triggerer(s) alive"
    if name == "double_bump":
        if seen.schedulers_alive is None:
            return None, "schedulers alive: unknown"
        return seen.schedulers_alive >= 2, f"{seen.schedulers_alive} scheduler(s) alive"
    if seen.asset_dags is None:
        return None, "asset-scheduled DAGs: unknown"
    return seen.asset_dags > 0, f"{seen.asset_dags} asset-scheduled DAG(s) (one scheduler is enough)"


def assess_family(seen: Observed) -> list[FamilyRisk]:
    """One verdict per kind of the rest of the family, and whether dupguard's check watches for it."""
    version = parse_version(seen.version)
    out = []
    for name, issues in FAMILY_ISSUES.items():
        affected, why = (
            (None, f"Airflow version {seen.version!r} not understood")
            if version is None
            else (family_affected(name, version))
        )
        status = Status.NOT_AFFECTED
        if affected is not False:
            exposed, how = _family_exposure(name, seen)
            why = f"{why}; {how}"
            unknown = exposed is None or (affected is None and exposed)
            status = Status.UNKNOWN if unknown else (Status.AT_RISK if exposed else Status.NOT_EXPOSED)
        watched = name in seen.checks_on
        why += "; dupguard's check watches for it" if watched else "; dupguard's check does not run here"
        out.append(FamilyRisk(name, issues, affected, status, watched, why))
    return out

"""Findings as text for people (table) and for tools (JSON, CSV). The JSON shape is a contract.

JSON (``format_version`` 1): ``scan --format json`` prints exactly one such document on stdout
whatever happens -- also for Airflow 2 (``note`` says why nothing was examined) and for every early
exit (bad usage, configuration or database: ``error`` holds the exit code and the one-line message
also printed on stderr; fields not known yet are null). ``--format csv`` always prints its header::

    {"format_version": 1, "dupguard_version": "...", "airflow_version": ">=3.1.0,<3.1.8" | null,
     "schema_family": "3.1" | null, "scanned_at": ISO | null, "since": ISO | null, "runs_examined": int,
     "note": str | null, "error": {"exit_code": 2 | 3, "message": str} | null,
     "summary": {"groups": n, "confirmed": n, "suspected": n, "duplicate_runs": n, "duplicate_task_seconds": x},
     "groups": [{"key", "dag_id", "kind", "confidence", "kept_run_id", "duplicate_run_ids", "shared_event_ids",
                 "run_after", "partition_key", "creating_job_ids", "creator_hostnames",
                 "duplicate_task_seconds", "runs": [{"id", "run_id", "state", "kept", "creating_job_id",
                 "creator_hostname", "queued_at", "tasks_total", "tasks_started", "task_seconds"}]}],
     "split_partitions": [{"key", "kind": "split_partition", "dag_id", "partition_key", "split_at", "waiting",
                           "stuck_row_ids", "rows": [{"id", "created_at", "age_seconds", "pending",
                           "created_dag_run_id", "event_ids"}]}]}

``split_partitions`` and ``summary.split_partitions`` (deprecated, ``DEPRECATED``): the facts of
``checks.split_partition`` and their count, as format 1 had them before split partitions became a check
like the others; kept until 1.2.0 (CHANGELOG), read ``checks.split_partition`` instead. Split keys are not
duplicate groups (no run may exist yet), so ``groups`` and ``summary.groups`` never count them. CSV lists
groups only.

``source`` (added with ``--source api``, still ``format_version`` 1): ``database`` or ``api``. With
``api`` the REST API shows no ``dag_run.id``, creating job or host (``runs[].id``,
``creating_job_ids``, ``creator_hostnames`` are null) and no ``asset_partition_dag_run`` rows
(no ``split_partition`` check; a suspected partitioned group is never refined by them).

``checks`` (added with the periodic checks, still ``format_version`` 1): what each periodic check that ran found, by
kind (``{"split_partition": [...], ...}``; a check that does not apply to this Airflow or is switched off
has no key). Every entry has ``key``, ``kind``, ``confidence`` (``confirmed``, ``suspected`` or
``exposure``: a risk inferred from the database, not a thing seen), ``severity``, ``dag_ids``, ``title``,
``lines``, ``advice``, ``seen_at`` and the kind's own fields (docs/explanation/detection.md).
``summary.checks`` counts them by kind.

``check_errors`` (added after the 100M-row measurement, still ``format_version`` 1): ``{kind:
message}`` for each check that failed (e.g. its statement outlasted ``--db-timeout``); that kind then has
no key in ``checks``, and the groups and the other checks stand. ``{}`` when every check answered.

``server`` (added with standby support, still ``format_version`` 1): ``{"role": "primary" | "standby",
"replay_lag_seconds": x | null}``, the PostgreSQL server the scan read; null for SQLite, ``--source
api`` and an error document. A standby may lag the primary: runs committed there within the lag are
not in the scan (``replay_lag_seconds``: 0 when it replayed all it received, else the age of the last
transaction it replayed; null when unknown).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from detector import __version__
from detector.app.scan import ScanReport
from detector.core.checks import Observation
from detector.core.model import NO_PROGRESS, Confidence, Finding
from detector.logs import printable  # also escapes the console log's values

# Keys of format 1 deprecated when their check became a check like the others: key -> the kind whose
# observations' facts it repeats. Removed in 1.2.0 (CHANGELOG); readers move to ``checks.<kind>``.
DEPRECATED = {"split_partitions": "split_partition"}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def finding_dict(f: Finding, *, ids: bool = True) -> dict[str, Any]:
    """``ids`` False (``--source api``): ``runs[].id`` is null, as the REST API never shows ``dag_run.id``."""
    return {
        "key": f.key,
        "dag_id": f.dag_id,
        "kind": f.kind.value,
        "confidence": f.confidence.value,
        "kept_run_id": f.kept.run_id,
        "duplicate_run_ids": [r.run_id for r in f.duplicates],
        "shared_event_ids": list(f.shared_event_ids),
        "run_after": _iso(f.run_after),
        "partition_key": f.partition_key,
        "creating_job_ids": list(f.creating_job_ids),
        "creator_hostnames": [r.creator_hostname for r in f.runs],
        "duplicate_task_seconds": round(f.duplicate_task_seconds, 3),
        "runs": [
            {
                "id": r.id if ids else None,
                "run_id": r.run_id,
                "state": r.state,
                "kept": r is f.kept,
                "creating_job_id": r.creating_job_id,
                "creator_hostname": r.creator_hostname,
                "queued_at": _iso(r.queued_at),
                "tasks_total": f.progress.get(r.id, NO_PROGRESS).total,
                "tasks_started": f.progress.get(r.id, NO_PROGRESS).started,
                "task_seconds": round(f.progress.get(r.id, NO_PROGRESS).task_seconds, 3),
            }
            for r in f.runs
        ],
    }


def summary(findings: Sequence[Finding]) -> dict[str, Any]:
    return {
        "groups": len(findings),
        "confirmed": sum(f.confidence is Confidence.CONFIRMED for f in findings),
        "suspected": sum(f.confidence is Confidence.SUSPECTED for f in findings),
        "duplicate_runs": sum(len(f.duplicates) for f in findings),
        "duplicate_task_seconds": round(sum(f.duplicate_task_seconds for f in findings), 3),
    }


def _deprecated(report: ScanReport) -> dict[str, list[dict[str, Any]]]:
    """Each deprecated key of format 1 with its check's facts (empty when the check did not run)."""
    return {key: [dict(o.facts) for o in report.observations.get(kind, [])] for key, kind in DEPRECATED.items()}


def as_json(report: ScanReport) -> str:
    deprecated = _deprecated(report)
    doc: dict[str, Any] = {
        "format_version": 1,
        "dupguard_version": __version__,
        "airflow_version": report.info.airflow_version,
        "schema_family": report.info.family.value,
        "scanned_at": _iso(report.scanned_at),
        "since": _iso(report.since),
        "runs_examined": report.runs_examined,
        "note": report.note,
        "error": None,
        "summary": summary(report.findings)
        | {k: len(v) for k, v in deprecated.items()}
        | {"checks": {k: len(v) for k, v in report.observations.items()}},
        "groups": [finding_dict(f, ids=report.source == "database") for f in report.findings],
        **deprecated,
        "checks": {k: [o.as_dict() for o in v] for k, v in report.observations.items()},
        "check_errors": dict(report.check_errors),
        "source": report.source,
        "server": report.server.as_dict() if report.server is not None else None,
    }
    return json.dumps(doc, indent=2)


def error_json(exit_code: int, message: str) -> str:
    """The document of a scan that stopped before it could examine anything."""
    doc: dict[str, Any] = {
        "format_version": 1,
        "dupguard_version": __version__,
        "airflow_version": None,
        "schema_family": None,
        "scanned_at": None,
        "since": None,
        "runs_examined": 0,
        "note": None,
        "error": {"exit_code": exit_code, "message": message},
        "summary": summary([]) | dict.fromkeys(DEPRECATED, 0) | {"checks": {}},
        "groups": [],
        **{key: [] for key in DEPRECATED},
        "checks": {},
        "check_errors": {},
        "server": None,
    }
    return json.dumps(doc, indent=2)


def csv_header() -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(CSV_COLUMNS)
    return out.getvalue()


CSV_COLUMNS = (
    "dag_id",
    "kind",
    "confidence",
    "run_after",
    "partition_key",
    "kept_run_id",
    "duplicate_run_ids",
    "shared_event_ids",
    "creating_job_ids",
    "duplicate_task_seconds",
)


def _cell(value: object) -> object:
    return printable(value) if isinstance(value, str) else value


def as_csv(report: ScanReport) -> str:
    """One row per group; list fields are space-separated so spreadsheets keep them in one cell; text
    cells have non-printable characters escaped (``printable``)."""
    out = io.StringIO()
    out.write(csv_header())
    writer = csv.writer(out, lineterminator="\n")
    for f in report.findings:
        d = finding_dict(f, ids=report.source == "database")
        writer.writerow(
            [
                _cell(" ".join("" if v is None else str(v) for v in d[c]) if isinstance(d[c], list) else d[c])
                for c in CSV_COLUMNS
            ]
        )
    return out.getvalue()


def as_table(report: ScanReport) -> str:
    """A human summary: one block per group, most important first; non-printable characters escaped."""
    return "".join(printable(line) + "\n" for line in _table_lines(report))


def _table_lines(report: ScanReport) -> list[str]:
    if report.note and not report.findings:
        return report.note.splitlines()
    lines = [
        f"Airflow {report.info.airflow_version} (schema {report.info.family.value}); "
        f"examined {report.runs_examined} candidate runs"
        + (f" since {report.since.isoformat()}" if report.since else " over all history")
        + (f"; read from the {report.server.describe()}" if report.server is not None else ""),
    ]
    lines.extend(_observation_lines([o for v in report.observations.values() for o in v]))
    lines.extend(
        f"Check {kind} failed, so its findings are missing: {why}" for kind, why in report.check_errors.items()
    )
    if not report.findings:
        lines.append("No duplicate asset-triggered runs found.")
        return lines
    s = summary(report.findings)
    lines.append(
        f"{s['groups']} duplicate group(s): {s['confirmed']} confirmed, {s['suspected']} suspected; "
        f"{s['duplicate_runs']} duplicate run(s) ran {s['duplicate_task_seconds']:.1f} task-seconds"
    )
    for f in sorted(report.findings, key=lambda f: (f.confidence is not Confidence.CONFIRMED, f.dag_id, f.run_after)):
        where = (
            f"partition {f.partition_key!r}" if f.partition_key is not None else f"run_after {f.run_after.isoformat()}"
        )
        lines.append("")
        lines.append(f"[{f.confidence.value.upper()}] {f.dag_id}  {f.kind.value}  {where}")
        lines.append(f"  shared events: {', '.join(map(str, f.shared_event_ids)) or '(none)'}")
        for r in f.runs:
            p = f.progress.get(r.id, NO_PROGRESS)
            role = "keep     " if r is f.kept else "duplicate"
            host = f" on {r.creator_hostname}" if r.creator_hostname else ""
            lines.append(
                f"  {role} {r.run_id}  state={r.state}  job={r.creating_job_id}{host}  "
                f"tasks started {p.started}/{p.total}"
            )
    return lines


def _observation_lines(observations: Sequence[Observation]) -> list[str]:
    """What the periodic checks found, kind by kind in the registry's order."""
    lines: list[str] = []
    for obs in observations:
        lines.append(f"[{obs.kind.replace('_', ' ').upper()}, {obs.confidence}] {obs.title}")
        lines.extend(f"  {line}" for line in obs.lines)
        lines.append(f"  what to do: {obs.advice}")
        lines.append("")
    return lines

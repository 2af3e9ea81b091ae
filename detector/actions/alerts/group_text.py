"""What every channel says about a duplicate group, whatever its format: the outcome in words
(``status_of``, ``result_label``), the whole group as plain text (``plain_text``: Slack's fallback,
the webhook's ``text``, Alertmanager's description, an undelivered alert's log line), the JSON of a
run and of a remediation (the webhook payload and the log events), and the lines of a storm digest.

Pure: events in, data out; no clock, no network. Imported by the channels (``channels/``) and
``slack_messages``, never the other way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from detector.actions.alerts.oncall import Guidance, guidance
from detector.actions.alerts.text import TEXT_LIMIT, clip, escape, run_url
from detector.core.model import Confidence, Run
from detector.core.ports import AlertEvent, AlertKind, RemediationResult, Result

# Raw names are cut before escaping so one name can never fill a section on its own.
NAME_LIMIT = 250  # Airflow's own dag_id / run_id limit
_HOST_LIMIT = 100
_DETAIL_LIMIT = 300
LEVELS = ("CRITICAL", "HIGH", "WARNING", "INFO")  # oncall.guidance's levels, the worst first


@dataclass(frozen=True)
class Status:
    """The outcome of a group's remediation, reduced to one word and one line."""

    name: str  # remediated, failed, caught_after_start, too_late, dry_run, no_action, pending
    label: str


PENDING = Status("pending", "remediation pending")


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()  # microseconds: run_after is the group key


def creator(run: Run) -> str:
    job = f"scheduler job {run.creating_job_id}" if run.creating_job_id is not None else "scheduler job unknown"
    host = clip(run.creator_hostname, _HOST_LIMIT) if run.creator_hostname else "unknown host"
    return f"{job} on {host}"


def _plain_run(run: Run, ui_url: str | None, result: RemediationResult | None = None) -> str:
    url = run_url(ui_url, run.dag_id, run.run_id)
    text = f"  - {run.run_id} ({creator(run)})"
    if url:
        text += f" {url}"
    if result is not None:
        text += f" [{result_label(result)}]"
    return text


# --- status ------------------------------------------------------------------------------------------

_RESULT_LABELS = {
    Result.DONE: "stopped",
    Result.DRY_RUN: "would be stopped (dry-run)",
    Result.ALREADY: "already stopped",
    Result.TOO_LATE: "too late: its tasks had started (or Airflow ended them); left alone",
    Result.CAUGHT_AFTER_START: "stopped mid-run: a task had started before the stop landed",
    Result.GONE: "deleted before it could be stopped",
    Result.UNKNOWN: "stop sent, not confirmed: check the run in Airflow",
    Result.FAILED: "remediation FAILED",
    Result.SKIPPED: "left alone",
}


def result_label(result: RemediationResult) -> str:
    label = _RESULT_LABELS[result.result]
    if result.result is Result.SKIPPED:
        label = f"left alone ({result.action.outcome.value.replace('_', ' ')})"
    detail = result.detail
    if detail.startswith(label.split(":", 1)[0]):  # "too late: …": the detail says it all, once
        label, detail = clip(detail, _DETAIL_LIMIT), ""
    if result.started_tasks:  # named first: the detail can be cut, the tasks that ran must not be
        label += " — ran: " + ", ".join(clip(t.describe(), NAME_LIMIT) for t in result.started_tasks[:10])
        if len(result.started_tasks) > 10:
            label += f" and {len(result.started_tasks) - 10} more"
    if detail:
        label += f": {clip(detail, _DETAIL_LIMIT)}"
    return label


def status_of(results: Sequence[RemediationResult]) -> Status:
    """One status for a group: the worst result wins (failed > caught after start > unknown > too late >
    dry-run > stopped > nothing)."""
    kinds = {r.result for r in results}
    if not results:
        return PENDING
    if Result.FAILED in kinds:
        return Status("failed", "remediation failed")
    if Result.CAUGHT_AFTER_START in kinds:
        # Stopped, but user code of the duplicate ran (and was killed mid-run): check its side effects.
        return Status("caught_after_start", "caught after start: a duplicate's task ran and was stopped")
    if Result.UNKNOWN in kinds:
        return Status("unknown", "not confirmed: a stop was sent but could not be read back")
    if Result.TOO_LATE in kinds:
        return Status("too_late", "too late: the duplicate had started")
    if Result.DRY_RUN in kinds:
        return Status("dry_run", "dry-run: would stop the duplicate")
    if kinds <= {Result.DONE, Result.ALREADY, Result.GONE} and kinds & {Result.DONE, Result.ALREADY}:
        return Status("remediated", "duplicate stopped")
    return Status("no_action", "no remediation")


def event_guidance(event: AlertEvent, ui_url: str | None, results: Sequence[RemediationResult]) -> Guidance:
    """``oncall.guidance`` for ``event`` as it stands with ``results``."""
    return guidance(event.finding, event.mode, status_of(results).name, results, ui_url, event.unstopped_severity)


# --- plain text (fallback, logs, descriptions) ---------------------------------------------------------


def title(event: AlertEvent) -> str:
    f = event.finding
    grew = f" (group grew: {len(event.new_runs)} more run{'s' if len(event.new_runs) > 1 else ''})"
    tail = grew if event.new_runs and event.kind is AlertKind.DETECTED else ""
    if f.confidence is Confidence.SUSPECTED:
        return f"Suspected duplicate run of DAG {f.dag_id} on {event.cluster}{tail}"
    return f"Duplicate run of DAG {f.dag_id} on {event.cluster}{tail}"


def plain_text(event: AlertEvent, ui_url: str | None = None) -> str:
    """Everything the alert says, as plain text, never cut: what an undelivered alert logs."""
    f = event.finding
    results = {r.action.run.run_id: r for r in event.results}
    lines = [title(event) if event.kind is AlertKind.DETECTED else f"{title(event)}: {status_of(event.results).label}"]
    outcome = f", outcome at {iso(event.outcome_at)}" if event.outcome_at else ""
    lines.append(
        f"group {f.key}: {f.confidence.value} {f.kind.value} duplicate, detected at {iso(event.detected_at)}{outcome}"
    )
    if event.assets:
        lines.append("assets: " + ", ".join(event.assets))
    lines.append("shared asset events: " + (", ".join(map(str, f.shared_event_ids)) or "none"))
    lines.append(f"run_after {iso(f.run_after)}" + (f", partition {f.partition_key}" if f.partition_key else ""))
    lines.append("kept run:")
    lines.append(_plain_run(f.kept, ui_url))
    lines.append(f"duplicate run(s) ({len(f.duplicates)}):")
    lines.extend(_plain_run(r, ui_url, results.get(r.run_id)) for r in f.duplicates)
    lines.append(f"remediation mode {event.mode}: {status_of(event.results).label}")
    if f.confidence is Confidence.SUSPECTED:
        lines.append(SUSPECTED_NOTE)
    if event.observed_at:
        lines.append(observed_note(event))
    if event.unrecorded:
        lines.append(may_repeat(event.unrecorded))
    return "\n".join(lines)


def observed_note(event: AlertEvent) -> str:
    """An OUTCOME for a duplicate a dry run found: the update of that incident, in the mode now set."""
    found, now = iso(event.observed_at), iso(event.outcome_at)
    return f"Found during dry-run at {found}; judged again in mode {event.mode} at {now}."


def may_repeat(reason: str) -> str:
    """What an alert says when the ledger could not record it: it is sent anyway."""
    return (
        f"May repeat: the ledger could not record this alert ({reason}); another replica or a restart "
        "may send it again. Nothing is remediated until the ledger records the group."
    )


SUSPECTED_NOTE = (
    "Suspected: same partition key within the suspect window but different asset events. "
    "Never remediated automatically; check whether both runs should exist."
)


def fallback(text: str) -> str:
    """``text`` as a Slack fallback: cut to ``TEXT_LIMIT``, mrkdwn escaped."""
    return escape(clip(text, TEXT_LIMIT))


# --- storm digests -------------------------------------------------------------------------------------


def digest_text(events: Sequence[AlertEvent]) -> str:
    """One line per group, built only as far as the fallback limit reaches (storms can be huge)."""
    cluster = events[0].cluster if events else ""
    out = [f"{len(events)} duplicate DAG run groups on {cluster}:"]
    size = len(out[0])
    for e in events:
        f = e.finding
        dups = ", ".join(clip(r.run_id, NAME_LIMIT) for r in f.duplicates[:3])
        line = clip(f"{f.dag_id} ({f.confidence.value}): kept {f.kept.run_id}, duplicates {dups}", 600)
        out.append(line)
        size += len(line) + 1
        if size > TEXT_LIMIT:
            break
    return "\n".join(out)


def worst_first(events: Sequence[AlertEvent]) -> list[AlertEvent]:
    """Groups by their level, the worst first: what on-call handles first."""
    return sorted(events, key=lambda e: LEVELS.index(event_guidance(e, None, e.results).level))


def digest_outcome_text(ranked: Sequence[AlertEvent]) -> str:
    """The outcomes of digested groups (``worst_first``), one line each: Slack's fallback, the webhook's text."""
    return fallback("\n".join(f"{e.finding.dag_id}: {status_of(e.results).label}" for e in ranked))


# --- JSON (webhook payloads, log events) ---------------------------------------------------------------


def run_json(run: Run, ui_url: str | None) -> dict[str, Any]:
    return {
        "id": run.id,
        "run_id": run.run_id,
        "state": run.state,
        "run_after": iso(run.run_after),
        "queued_at": iso(run.queued_at),
        "partition_key": run.partition_key,
        "creating_job_id": run.creating_job_id,
        "creator_hostname": run.creator_hostname,
        "url": run_url(ui_url, run.dag_id, run.run_id),
    }


def remediation_json(event: AlertEvent) -> dict[str, Any]:
    return {
        "mode": event.mode,
        "status": status_of(event.results).name,
        "results": [
            {
                "run_id": r.action.run.run_id,
                "outcome": r.action.outcome.value,
                "result": r.result.value,
                "detail": r.detail,
                "committed_at": iso(r.committed_at),
                "started_tasks": [
                    {"task_id": t.task_id, "map_index": t.map_index, "state_before": t.before, "state_after": t.after}
                    for t in r.started_tasks
                ],
            }
            for r in event.results
        ],
    }

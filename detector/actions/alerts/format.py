"""What an alert says: Slack Block Kit messages, their plain-text fallback, and the generic webhook payload.

Pure: events in, data out; no clock, no network. Every Slack limit is enforced here, whatever the DAG,
run and asset names: a header is at most 150 characters, a section's text at most 3000, a message at
most 50 blocks (https://api.slack.com/reference/block-kit/blocks). Long lists end in "… and N more";
the full content always reaches the logs (``plain_text``).

Slack mrkdwn treats ``&``, ``<`` and ``>`` as control characters, so every name is escaped, and a
cut never splits an escape or a ``<url|label>`` link.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from detector.actions.alerts.oncall import (
    DUPLICATE_ALERT,
    NO_LINKS,
    Guidance,
    Links,
    guidance,
    guidance_section,
    icon,
    links_context,
)

# re-exported: split.py, alertmanager.py and tests take them from here
from detector.actions.alerts.text import HEADER_LIMIT as HEADER_LIMIT
from detector.actions.alerts.text import SECTION_LIMIT as SECTION_LIMIT
from detector.actions.alerts.text import clip as clip
from detector.actions.alerts.text import context as _context
from detector.actions.alerts.text import cut_mrkdwn as _cut_mrkdwn
from detector.actions.alerts.text import escape as escape
from detector.actions.alerts.text import header as _header
from detector.actions.alerts.text import run_url as run_url
from detector.actions.alerts.text import section as _section
from detector.actions.alerts.text import slack_date
from detector.core.model import Confidence, Finding, Run
from detector.core.ports import AlertEvent, AlertKind, RemediationResult, Result

BLOCK_LIMIT = 50
TEXT_LIMIT = 3000  # the notification fallback; Slack accepts 40 000 but truncates much earlier on phones
SUMMARY_LIMIT = 1024  # PagerDuty's summary limit, a sane bound for any receiver
SCHEMA = "dupguard.alert/v1"
# One webhook POST stays small for any receiver (PagerDuty's Events API takes 512 KB, many gateways
# 1 MB); a bigger storm is split into parts.
DIGEST_MAX_BYTES = 256_000
DIGEST_MAX_GROUPS = 100

# Raw names are cut before escaping so one name can never fill a section on its own.
_NAME_LIMIT = 250  # Airflow's own dag_id / run_id limit
_ASSET_LIMIT = 300
_HOST_LIMIT = 100
_DETAIL_LIMIT = 300
_LINK_LINE_LIMIT = 1000  # beyond this a line drops its link and keeps the label


@dataclass(frozen=True)
class Message:
    """A Slack message: ``text`` is the fallback (notifications, screen readers), ``blocks`` the layout."""

    text: str
    blocks: tuple[dict[str, Any], ...]

    def as_kwargs(self) -> dict[str, Any]:
        return {"text": self.text, "blocks": list(self.blocks)}


@dataclass(frozen=True)
class Status:
    """The outcome of a group's remediation, reduced to one word and one line."""

    name: str  # remediated, failed, caught_after_start, too_late, dry_run, no_action, pending
    label: str
    severity: str


PENDING = Status("pending", "remediation pending", "info")


# --- small helpers -----------------------------------------------------------------------------------


def _name(text: str, limit: int = _NAME_LIMIT) -> str:
    return escape(clip(text, limit)).replace("`", "'")


def _fit(lines: Sequence[str], limit: int = SECTION_LIMIT, what: str = "more") -> str:
    """Join whole lines up to ``limit`` characters, then say how many were left out."""
    out: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        rest = len(lines) - i - 1
        tail = len(f"\n… and {rest} {what}") if rest else 0
        line = _cut_mrkdwn(line, limit - tail - 1)
        extra = len(line) + (1 if out else 0)
        if used + extra + tail > limit:
            out.append(f"… and {len(lines) - i} {what}")
            break
        out.append(line)
        used += extra
    return "\n".join(out)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()  # microseconds: run_after is the group key


def _creator(run: Run) -> str:
    job = f"scheduler job {run.creating_job_id}" if run.creating_job_id is not None else "scheduler job unknown"
    host = clip(run.creator_hostname, _HOST_LIMIT) if run.creator_hostname else "unknown host"
    return f"{job} on {host}"


def _link(ui_url: str | None, run: Run) -> str | None:
    """The run's UI link, or None when it could not fit a line anyway (names far beyond Airflow's limits)."""
    if ui_url is None or len(ui_url) + 3 * (len(run.dag_id) + len(run.run_id)) > _LINK_LINE_LIMIT:
        return None
    return run_url(ui_url, run.dag_id, run.run_id)


def _run_line(run: Run, ui_url: str | None, result: RemediationResult | None = None) -> str:
    label = f"`{_name(run.run_id)}`"
    url = _link(ui_url, run)
    linked = f"<{url}|{_name(run.run_id)}>" if url else label
    suffix = f" — {escape(_creator(run))}"
    if run.state:
        suffix += f" — state {escape(clip(run.state, 40))}"
    if result is not None:
        suffix += f" — *{escape(result_label(result))}*"
    line = f"• {linked}{suffix}"
    return line if len(line) <= _LINK_LINE_LIMIT else f"• {label}{suffix}"


def _plain_run(run: Run, ui_url: str | None, result: RemediationResult | None = None) -> str:
    url = run_url(ui_url, run.dag_id, run.run_id)
    text = f"  - {run.run_id} ({_creator(run)})"
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
        label += " — ran: " + ", ".join(clip(t.describe(), _NAME_LIMIT) for t in result.started_tasks[:10])
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
        return Status("failed", "remediation failed", "error")
    if Result.CAUGHT_AFTER_START in kinds:
        # Stopped, but user code of the duplicate ran (and was killed mid-run): check its side effects.
        return Status("caught_after_start", "caught after start: a duplicate's task ran and was stopped", "warning")
    if Result.UNKNOWN in kinds:
        return Status("unknown", "not confirmed: a stop was sent but could not be read back", "warning")
    if Result.TOO_LATE in kinds:
        return Status("too_late", "too late: the duplicate had started", "warning")
    if Result.DRY_RUN in kinds:
        return Status("dry_run", "dry-run: would stop the duplicate", "info")
    if kinds <= {Result.DONE, Result.ALREADY, Result.GONE} and kinds & {Result.DONE, Result.ALREADY}:
        return Status("remediated", "duplicate stopped", "info")
    return Status("no_action", "no remediation", "info")


def severity(event: AlertEvent) -> str:
    """``error`` for a confirmed duplicate, ``warning`` for a suspected one; outcomes by their status."""
    if event.kind is AlertKind.OUTCOME:
        return status_of(event.results).severity
    return "error" if event.finding.confidence is Confidence.CONFIRMED else "warning"


def outcome_signature(event: AlertEvent) -> str:
    """Stable id of one outcome (which run ended how), so a replayed outcome is not announced twice."""
    parts = sorted(f"{r.action.run.run_id}={r.result.value}" for r in event.results)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def joined_signature(event: AlertEvent) -> str:
    """Stable id of the runs that joined an announced group, so that news is announced once."""
    return hashlib.sha256("\n".join(sorted(event.new_runs)).encode()).hexdigest()[:16]


# --- plain text (fallback and logs) ------------------------------------------------------------------


def _title(event: AlertEvent) -> str:
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
    lines = [
        _title(event) if event.kind is AlertKind.DETECTED else f"{_title(event)}: {status_of(event.results).label}"
    ]
    lines.append(f"group {f.key}: {f.confidence.value} {f.kind.value} duplicate, detected {_iso(event.detected_at)}")
    if event.assets:
        lines.append("assets: " + ", ".join(event.assets))
    lines.append("shared asset events: " + (", ".join(map(str, f.shared_event_ids)) or "none"))
    lines.append(f"run_after {_iso(f.run_after)}" + (f", partition {f.partition_key}" if f.partition_key else ""))
    lines.append("kept run:")
    lines.append(_plain_run(f.kept, ui_url))
    lines.append(f"duplicate run(s) ({len(f.duplicates)}):")
    lines.extend(_plain_run(r, ui_url, results.get(r.run_id)) for r in f.duplicates)
    lines.append(f"remediation mode {event.mode}: {status_of(event.results).label}")
    if f.confidence is Confidence.SUSPECTED:
        lines.append(_SUSPECTED_NOTE)
    if event.unrecorded:
        lines.append(may_repeat(event.unrecorded))
    return "\n".join(lines)


def may_repeat(reason: str) -> str:
    """What an alert says when the ledger could not record it (issue 23 §3): it is sent anyway."""
    return (
        f"May repeat: the ledger could not record this alert ({reason}); another replica or a restart "
        "may send it again. Nothing is remediated until the ledger records the group."
    )


_SUSPECTED_NOTE = (
    "Suspected: same partition key within the suspect window but different asset events. "
    "Never remediated automatically; check whether both runs should exist."
)


def _fallback(text: str) -> str:
    return escape(clip(text, TEXT_LIMIT))


# --- Slack messages ----------------------------------------------------------------------------------


def _guidance(event: AlertEvent, ui_url: str | None, results: Sequence[RemediationResult]) -> Guidance:
    return guidance(event.finding, event.mode, status_of(results).name, results, ui_url)


def _group_blocks(
    event: AlertEvent, ui_url: str | None, results: Sequence[RemediationResult], links: Links = NO_LINKS
) -> list[dict[str, Any]]:
    f = event.finding
    by_run = {r.action.run.run_id: r for r in results}
    suspected = f.confidence is Confidence.SUSPECTED
    advice = _guidance(event, ui_url, results)
    head = (
        f"{icon(advice.level)} {advice.level}: {'Suspected duplicate' if suspected else 'Duplicate'} run of {f.dag_id}"
    )
    facts = [
        f"*DAG:* `{_name(f.dag_id)}`  *Cluster:* {_name(event.cluster, 100)}",
        f"*Confidence:* {f.confidence.value}  *Kind:* {f.kind.value}",
    ]
    if event.assets:
        facts.append("*Asset(s):* " + ", ".join(f"`{_name(a, _ASSET_LIMIT)}`" for a in event.assets))
    facts.append("*Shared asset event ids:* " + (", ".join(map(str, f.shared_event_ids)) or "none"))
    facts.append(f"*Run after:* {slack_date(f.run_after)}")
    if f.partition_key is not None:
        facts.append(f"*Partition key:* `{_name(f.partition_key)}`")
    blocks = [
        _header(head),
        guidance_section(advice),
        _section(_fit(facts)),
        _section(_fit(["*Kept run*", _run_line(f.kept, ui_url)])),
        _section(
            _fit(
                [f"*Duplicate run(s)* ({len(f.duplicates)})"]
                + [_run_line(r, ui_url, by_run.get(r.run_id)) for r in f.duplicates],
                what="more duplicate runs",
            )
        ),
    ]
    status = status_of(results)
    remediation = f"*Remediation:* mode `{_name(event.mode, 40)}` — {status.label}"
    if suspected:
        remediation += f"\n{_SUSPECTED_NOTE}"
    blocks.append(_section(remediation))
    if event.unrecorded:
        blocks.append(_context(":warning: " + escape(clip(may_repeat(event.unrecorded), SECTION_LIMIT - 20))))
    blocks.append(links_context(DUPLICATE_ALERT, links, ui_url, f.dag_id))
    blocks.append(_context(f"Detected {slack_date(event.detected_at)} · group `{_name(f.key)}` · dupguard"))
    return blocks


def detected_message(
    event: AlertEvent, ui_url: str | None = None, results: Sequence[RemediationResult] = (), *, links: Links = NO_LINKS
) -> Message:
    """The first message about a group; with ``results`` it is the updated version showing the outcome.
    The fallback ``text`` (what a notification shows) starts with the severity in words."""
    shown = results or event.results
    blocks = _group_blocks(event, ui_url, shown, links)
    text = plain_text(event if not shown else _with_results(event, shown), ui_url)
    return Message(text=_fallback(f"{_guidance(event, ui_url, shown).headline}: {text}"), blocks=tuple(blocks))


def _with_results(event: AlertEvent, results: Sequence[RemediationResult]) -> AlertEvent:
    return dataclasses.replace(event, kind=AlertKind.OUTCOME, results=tuple(results))


def outcome_message(
    event: AlertEvent, ui_url: str | None = None, *, threaded: bool = True, links: Links = NO_LINKS
) -> Message:
    """A remediation follow-up. In a thread it is short; standalone it repeats the whole group."""
    f = event.finding
    status = status_of(event.results)
    advice = _guidance(event, ui_url, event.results)
    lines = [f"*{escape(status.label.capitalize())}* (mode `{_name(event.mode, 40)}`)"]
    if not threaded:
        lines.insert(
            0,
            f"*Follow-up:* duplicate run of `{_name(f.dag_id)}` on {_name(event.cluster, 100)}, "
            f"kept `{_name(f.kept.run_id)}`, group `{_name(f.key)}`",
        )
    lines += [
        f"• `{_name(r.action.run.run_id)}`: {escape(result_label(r))}"
        + (f" (committed {slack_date(r.committed_at)})" if r.committed_at else "")
        for r in event.results
    ]
    text = f"{advice.headline}: {f.dag_id}: {status.label}\n" + "\n".join(
        f"{r.action.run.run_id}: {result_label(r)}" for r in event.results
    )
    blocks = (
        guidance_section(advice),
        _section(_fit(lines, what="more runs")),
        links_context(DUPLICATE_ALERT, links, ui_url, f.dag_id),
    )
    return Message(text=_fallback(text), blocks=blocks)


def _digest_line(event: AlertEvent, ui_url: str | None) -> str:
    f = event.finding
    kept_url = _link(ui_url, f.kept)
    kept = f"<{kept_url}|kept>" if kept_url else "kept"
    dups = []
    for r in f.duplicates[:3]:
        url = _link(ui_url, r)
        dups.append(f"<{url}|{_name(r.run_id, 60)}>" if url else f"`{_name(r.run_id, 60)}`")
    more = f" +{len(f.duplicates) - 3}" if len(f.duplicates) > 3 else ""
    line = (
        f"• `{_name(f.dag_id, 100)}` {f.confidence.value} — {kept} `{_name(f.kept.run_id, 60)}`, "
        f"duplicate {', '.join(dups)}{more} — events {', '.join(map(str, f.shared_event_ids[:5])) or 'none'}"
    )
    return line if len(line) <= _LINK_LINE_LIMIT else _cut_mrkdwn(line, _LINK_LINE_LIMIT)


def digest_message(events: Sequence[AlertEvent], ui_url: str | None = None, *, links: Links = NO_LINKS) -> Message:
    """One message listing many groups (an alert storm): at most 50 blocks, however many groups."""
    cluster = events[0].cluster if events else ""
    confirmed = sum(1 for e in events if e.finding.confidence is Confidence.CONFIRMED)
    head = f":rotating_light: {len(events)} duplicate DAG run groups on {cluster}"
    level = "HIGH — duplicate runs detected" if confirmed else "WARNING — suspected duplicate runs"
    blocks: list[dict[str, Any]] = [
        _header(head),
        _section(
            f"*{level}*\n*What to do now:* watch this thread: each group's outcome follows, and a CRITICAL "
            "one (both runs executed, or a stop failed) needs its runs checked.\n"
            f"*Alert storm:* {len(events)} groups within a minute ({confirmed} confirmed, "
            f"{len(events) - confirmed} suspected), listed here instead of one message each. "
            "Every group is logged in full as `duplicate_detected`."
        ),
        links_context(DUPLICATE_ALERT, links),
    ]
    unrecorded = next((e.unrecorded for e in events if e.unrecorded), None)
    if unrecorded:
        blocks.append(_context(":warning: " + escape(clip(may_repeat(unrecorded), SECTION_LIMIT - 20))))
    room = BLOCK_LIMIT - len(blocks) - 1  # one block kept for "… and N more"
    sections: list[list[str]] = [[]]
    size = shown = 0
    for event in events:  # lines are made only while there is room: storms can be huge
        line = _digest_line(event, ui_url)
        if sections[-1] and size + len(line) + 1 > SECTION_LIMIT:
            if len(sections) == room:
                break
            sections.append([])
            size = 0
        sections[-1].append(line)
        size += len(line) + 1
        shown += 1
    blocks += [_section("\n".join(s)) for s in sections]
    hidden = len(events) - shown
    if hidden:
        blocks.append(_context(f"… and {hidden} more groups, see the `duplicate_detected` logs"))
    return Message(text=_fallback(_digest_text(events)), blocks=tuple(blocks))


def _digest_text(events: Sequence[AlertEvent]) -> str:
    """One line per group, built only as far as the fallback limit reaches (storms can be huge)."""
    cluster = events[0].cluster if events else ""
    out = [f"{len(events)} duplicate DAG run groups on {cluster}:"]
    size = len(out[0])
    for e in events:
        f = e.finding
        dups = ", ".join(clip(r.run_id, _NAME_LIMIT) for r in f.duplicates[:3])
        line = clip(f"{f.dag_id} ({f.confidence.value}): kept {f.kept.run_id}, duplicates {dups}", 600)
        out.append(line)
        size += len(line) + 1
        if size > TEXT_LIMIT:
            break
    return "\n".join(out)


def digest_outcome_message(events: Sequence[AlertEvent], *, links: Links = NO_LINKS) -> Message:
    """Remediation outcomes of groups first announced in a digest, as one follow-up, each group with its
    severity in words (the worst first: what on-call handles first)."""
    ranked = sorted(events, key=lambda e: _LEVELS.index(_guidance(e, None, e.results).level))
    lines = [
        f"*Remediation outcomes* ({len(events)} groups)",
        "*What to do now:* each CRITICAL or HIGH group needs its runs checked or its duplicate stopped by hand "
        "(the group's `remediation_outcome` log line names them); INFO ones need nothing.",
    ]
    for e in ranked:
        g = _guidance(e, None, e.results)
        lines.append(f"• *{g.level}* `{_name(e.finding.dag_id, 100)}`: {escape(status_of(e.results).label)}")
    text = "\n".join(f"{e.finding.dag_id}: {status_of(e.results).label}" for e in ranked)
    blocks = (_section(_fit(lines, what="more groups")), links_context(DUPLICATE_ALERT, links))
    return Message(text=_fallback(text), blocks=blocks)


_LEVELS = ("CRITICAL", "HIGH", "WARNING", "INFO")


# --- generic webhook ---------------------------------------------------------------------------------


def _run_json(run: Run, ui_url: str | None) -> dict[str, Any]:
    return {
        "id": run.id,
        "run_id": run.run_id,
        "state": run.state,
        "run_after": _iso(run.run_after),
        "queued_at": _iso(run.queued_at),
        "partition_key": run.partition_key,
        "creating_job_id": run.creating_job_id,
        "creator_hostname": run.creator_hostname,
        "url": run_url(ui_url, run.dag_id, run.run_id),
    }


def group_json(event: AlertEvent, ui_url: str | None = None) -> dict[str, Any]:
    f: Finding = event.finding
    return {
        "key": f.key,
        "dag_id": f.dag_id,
        "kind": f.kind.value,
        "confidence": f.confidence.value,
        "assets": list(event.assets),
        "shared_event_ids": list(f.shared_event_ids),
        "run_after": _iso(f.run_after),
        "partition_key": f.partition_key,
        "kept": _run_json(f.kept, ui_url),
        "duplicates": [_run_json(r, ui_url) for r in f.duplicates],
        "new_run_ids": list(event.new_runs),
        "detected_at": _iso(event.detected_at),
        "may_repeat": event.unrecorded is not None,
    }


def _remediation_json(event: AlertEvent) -> dict[str, Any]:
    return {
        "mode": event.mode,
        "status": status_of(event.results).name,
        "results": [
            {
                "run_id": r.action.run.run_id,
                "outcome": r.action.outcome.value,
                "result": r.result.value,
                "detail": r.detail,
                "committed_at": _iso(r.committed_at),
                "started_tasks": [
                    {"task_id": t.task_id, "map_index": t.map_index, "state_before": t.before, "state_after": t.after}
                    for t in r.started_tasks
                ],
            }
            for r in event.results
        ],
    }


def webhook_payload(event: AlertEvent, ui_url: str | None = None) -> dict[str, Any]:
    """The ``dupguard.alert/v1`` payload of one group (``type`` detected or outcome); see docs/alerts.md."""
    summary = (
        _title(event) if event.kind is AlertKind.DETECTED else f"{_title(event)}: {status_of(event.results).label}"
    )
    return {
        "schema": SCHEMA,
        "type": event.kind.value,
        "severity": severity(event),
        "summary": clip(summary, SUMMARY_LIMIT),
        "dedup_key": event.finding.key,
        "cluster": event.cluster,
        "group": group_json(event, ui_url),
        "remediation": _remediation_json(event),
        "text": plain_text(event, ui_url),
    }


def digest_payloads(
    events: Sequence[AlertEvent],
    ui_url: str | None = None,
    *,
    max_bytes: int = DIGEST_MAX_BYTES,
    max_groups: int = DIGEST_MAX_GROUPS,
) -> list[tuple[Sequence[AlertEvent], dict[str, Any]]]:
    """A storm digest (of detections, or of the outcomes of digested groups) as one or more payloads
    of at most ``max_groups`` groups and ``max_bytes`` of JSON each (a single group bigger than that
    still goes alone), each with its groups' events. Each part has ``part`` (1-based), ``parts`` and
    ``total`` (groups in the whole digest); ``count`` and ``groups`` are the part's own."""
    chunks: list[Sequence[AlertEvent]] = []
    pending = [events[i : i + max_groups] for i in range(0, len(events), max_groups)]
    while pending:
        chunk = pending.pop(0)
        if len(chunk) > 1 and len(json.dumps(digest_payload(chunk, ui_url), default=str)) > max_bytes:
            half = len(chunk) // 2
            pending[:0] = [chunk[:half], chunk[half:]]
        else:
            chunks.append(chunk)
    return [
        (chunk, digest_payload(chunk, ui_url) | {"part": i, "parts": len(chunks), "total": len(events)})
        for i, chunk in enumerate(chunks, start=1)
    ]


def digest_payload(events: Sequence[AlertEvent], ui_url: str | None = None) -> dict[str, Any]:
    """The ``dupguard.alert/v1`` payload of a storm digest: ``type`` digest (detections) or
    digest_outcome (their remediation outcomes, each group with its ``remediation``);
    ``digest_payloads`` splits big ones."""
    cluster = events[0].cluster if events else ""
    outcomes = bool(events) and events[0].kind is AlertKind.OUTCOME
    if outcomes:
        ranks = {"info": 0, "warning": 1, "error": 2}
        worst = max((severity(e) for e in events), key=ranks.__getitem__)
        summary, text = f"{len(events)} remediation outcomes on {cluster}", digest_outcome_message(events).text
    else:
        worst = "error" if any(e.finding.confidence is Confidence.CONFIRMED for e in events) else "warning"
        summary, text = f"{len(events)} duplicate DAG run groups on {cluster}", _digest_text(events)
    return {
        "schema": SCHEMA,
        "type": "digest_outcome" if outcomes else "digest",
        "severity": worst,
        "summary": clip(summary, SUMMARY_LIMIT),
        "dedup_key": ("digest_outcome:" if outcomes else "digest:")
        + hashlib.sha256("\n".join(e.finding.key for e in events).encode()).hexdigest()[:16],
        "cluster": cluster,
        "count": len(events),
        "groups": [
            group_json(e, ui_url)
            | {"remediation_mode": e.mode}
            | ({"remediation": _remediation_json(e)} if outcomes else {})
            for e in events
        ],
        "text": text,
    }


# --- log fields --------------------------------------------------------------------------------------


def log_fields(event: AlertEvent, ui_url: str | None = None) -> dict[str, Any]:
    """Every field of a group, flat where it helps searching, for the ``duplicate_detected`` log event."""
    f = event.finding
    return {
        "group_key": f.key,
        "dag_id": f.dag_id,
        "kind": f.kind.value,
        "confidence": f.confidence.value,
        "kept_run": f.kept.run_id,
        "duplicate_runs": [r.run_id for r in f.duplicates],
        "new_runs": list(event.new_runs),
        "shared_event_ids": list(f.shared_event_ids),
        "assets": list(event.assets),
        "run_after": _iso(f.run_after),
        "partition_key": f.partition_key,
        "creating_job_ids": list(f.creating_job_ids),
        "creator_hostnames": [r.creator_hostname for r in f.runs],
        "runs": [_run_json(r, ui_url) for r in f.runs],
        "duplicate_task_seconds": f.duplicate_task_seconds,
        "detected_at": _iso(event.detected_at),
        "remediation_mode": event.mode,
        "cluster": event.cluster,
    }


def outcome_log_fields(event: AlertEvent) -> dict[str, Any]:
    f = event.finding
    rem = _remediation_json(event)
    return {
        "group_key": f.key,
        "dag_id": f.dag_id,
        "kept_run": f.kept.run_id,
        "remediation_mode": event.mode,
        "status": rem["status"],
        "results": rem["results"],
        "cluster": event.cluster,
    }


def limits_problems(blocks: Iterable[Mapping[str, Any]]) -> list[str]:
    """What in ``blocks`` breaks Slack's limits (empty when none): used by tests and as a last guard."""
    problems: list[str] = []
    blocks = list(blocks)
    if len(blocks) > BLOCK_LIMIT:
        problems.append(f"{len(blocks)} blocks > {BLOCK_LIMIT}")
    for i, b in enumerate(blocks):
        if b.get("type") == "header" and len(b["text"]["text"]) > HEADER_LIMIT:
            problems.append(f"block {i}: header of {len(b['text']['text'])} characters")
        if b.get("type") == "section" and len(b["text"]["text"]) > SECTION_LIMIT:
            problems.append(f"block {i}: section text of {len(b['text']['text'])} characters")
        if b.get("type") == "context":
            for e in b.get("elements", []):
                if len(e.get("text", "")) > SECTION_LIMIT:
                    problems.append(f"block {i}: context text of {len(e['text'])} characters")
    return problems

"""What a duplicate group's alert says in Slack (Block Kit), for both Slack channels (the bot and the
incoming webhook): the first message, its updated version, the follow-up, the storm digest and its
outcomes.

Pure: events in, data out; no clock, no network. Every Slack limit is enforced here, whatever the DAG,
run and asset names: a header is at most 150 characters, a section's text at most 3000, a message at
most 50 blocks (https://api.slack.com/reference/block-kit/blocks). Long lists end in "… and N more";
the full content always reaches the logs (``group_text.plain_text``).

Slack mrkdwn treats ``&``, ``<`` and ``>`` as control characters, so every name is escaped, and a
cut never splits an escape or a ``<url|label>`` link.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from detector.actions.alerts.group_text import (
    NAME_LIMIT,
    SUSPECTED_NOTE,
    creator,
    digest_outcome_text,
    digest_text,
    event_guidance,
    fallback,
    may_repeat,
    observed_note,
    plain_text,
    result_label,
    status_of,
    worst_first,
)
from detector.actions.alerts.oncall import DUPLICATE_ALERT, NO_LINKS, Links, guidance_section, icon, links_context
from detector.actions.alerts.text import (
    BLOCK_LIMIT,
    HEADER_LIMIT,
    SECTION_LIMIT,
    Message,
    clip,
    context,
    cut_mrkdwn,
    escape,
    header,
    run_url,
    section,
    slack_date,
)
from detector.core.model import Confidence, Run
from detector.core.ports import AlertEvent, AlertKind, RemediationResult

_ASSET_LIMIT = 300
_LINK_LINE_LIMIT = 1000  # beyond this a line drops its link and keeps the label


def _name(text: str, limit: int = NAME_LIMIT) -> str:
    return escape(clip(text, limit)).replace("`", "'")


def _fit(lines: Sequence[str], limit: int = SECTION_LIMIT, what: str = "more") -> str:
    """Join whole lines up to ``limit`` characters, then say how many were left out."""
    out: list[str] = []
    used = 0
    for i, line in enumerate(lines):
        rest = len(lines) - i - 1
        tail = len(f"\n… and {rest} {what}") if rest else 0
        line = cut_mrkdwn(line, limit - tail - 1)
        extra = len(line) + (1 if out else 0)
        if used + extra + tail > limit:
            out.append(f"… and {len(lines) - i} {what}")
            break
        out.append(line)
        used += extra
    return "\n".join(out)


def _link(ui_url: str | None, run: Run) -> str | None:
    """The run's UI link, or None when it could not fit a line anyway (names far beyond Airflow's limits)."""
    if ui_url is None or len(ui_url) + 3 * (len(run.dag_id) + len(run.run_id)) > _LINK_LINE_LIMIT:
        return None
    return run_url(ui_url, run.dag_id, run.run_id)


def _run_line(run: Run, ui_url: str | None, result: RemediationResult | None = None) -> str:
    label = f"`{_name(run.run_id)}`"
    url = _link(ui_url, run)
    linked = f"<{url}|{_name(run.run_id)}>" if url else label
    suffix = f" — {escape(creator(run))}"
    if run.state:
        suffix += f" — state {escape(clip(run.state, 40))}"
    if result is not None:
        suffix += f" — *{escape(result_label(result))}*"
    line = f"• {linked}{suffix}"
    return line if len(line) <= _LINK_LINE_LIMIT else f"• {label}{suffix}"


def _group_blocks(
    event: AlertEvent, ui_url: str | None, results: Sequence[RemediationResult], links: Links = NO_LINKS
) -> list[dict[str, Any]]:
    f = event.finding
    by_run = {r.action.run.run_id: r for r in results}
    suspected = f.confidence is Confidence.SUSPECTED
    advice = event_guidance(event, ui_url, results)
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
        header(head),
        guidance_section(advice),
        section(_fit(facts)),
        section(_fit(["*Kept run*", _run_line(f.kept, ui_url)])),
        section(
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
        remediation += f"\n{SUSPECTED_NOTE}"
    blocks.append(section(remediation))
    if event.observed_at:
        blocks.append(context(escape(observed_note(event))))
    if event.unrecorded:
        blocks.append(context(":warning: " + escape(clip(may_repeat(event.unrecorded), SECTION_LIMIT - 20))))
    blocks.append(links_context(DUPLICATE_ALERT, links, ui_url, f.dag_id))
    # an update keeps the detection time and adds the outcome's: on-call needs how long the stop took
    when = f"Detected at {slack_date(event.detected_at)}"
    if results and event.outcome_at:
        when += f" · outcome at {slack_date(event.outcome_at)}"
    blocks.append(context(f"{when} · group `{_name(f.key)}` · dupguard"))
    return blocks


def detected_message(
    event: AlertEvent, ui_url: str | None = None, results: Sequence[RemediationResult] = (), *, links: Links = NO_LINKS
) -> Message:
    """The first message about a group; with ``results`` it is the updated version showing the outcome.
    The fallback ``text`` (what a notification shows) starts with the severity in words."""
    shown = results or event.results
    blocks = _group_blocks(event, ui_url, shown, links)
    text = plain_text(event if not shown else _with_results(event, shown), ui_url)
    return Message(text=fallback(f"{event_guidance(event, ui_url, shown).headline}: {text}"), blocks=tuple(blocks))


def _with_results(event: AlertEvent, results: Sequence[RemediationResult]) -> AlertEvent:
    return dataclasses.replace(event, kind=AlertKind.OUTCOME, results=tuple(results))


def outcome_message(
    event: AlertEvent, ui_url: str | None = None, *, threaded: bool = True, links: Links = NO_LINKS
) -> Message:
    """A remediation follow-up. In a thread it is short; standalone it repeats the whole group."""
    f = event.finding
    status = status_of(event.results)
    advice = event_guidance(event, ui_url, event.results)
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
        section(_fit(lines, what="more runs")),
        links_context(DUPLICATE_ALERT, links, ui_url, f.dag_id),
    )
    return Message(text=fallback(text), blocks=blocks)


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
    return line if len(line) <= _LINK_LINE_LIMIT else cut_mrkdwn(line, _LINK_LINE_LIMIT)


def digest_message(events: Sequence[AlertEvent], ui_url: str | None = None, *, links: Links = NO_LINKS) -> Message:
    """One message listing many groups (an alert storm): at most 50 blocks, however many groups."""
    cluster = events[0].cluster if events else ""
    confirmed = sum(1 for e in events if e.finding.confidence is Confidence.CONFIRMED)
    head = f":rotating_light: {len(events)} duplicate DAG run groups on {cluster}"
    worst = event_guidance(worst_first(events)[0], None, ()).level if events else "WARNING"
    level = f"{worst} — duplicate runs detected" if confirmed else f"{worst} — suspected duplicate runs"
    blocks: list[dict[str, Any]] = [
        header(head),
        section(
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
        blocks.append(context(":warning: " + escape(clip(may_repeat(unrecorded), SECTION_LIMIT - 20))))
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
    blocks += [section("\n".join(s)) for s in sections]
    hidden = len(events) - shown
    if hidden:
        blocks.append(context(f"… and {hidden} more groups, see the `duplicate_detected` logs"))
    return Message(text=fallback(digest_text(events)), blocks=tuple(blocks))


def digest_outcome_message(events: Sequence[AlertEvent], *, links: Links = NO_LINKS) -> Message:
    """Remediation outcomes of groups first announced in a digest, as one follow-up, each group with its
    severity in words (the worst first: what on-call handles first)."""
    ranked = worst_first(events)
    lines = [
        f"*Remediation outcomes* ({len(events)} groups)",
        "*What to do now:* each CRITICAL or HIGH group needs its runs checked or its duplicate stopped by hand "
        "(the group's `remediation_outcome` log line names them); INFO ones need nothing.",
    ]
    for e in ranked:
        g = event_guidance(e, None, e.results)
        lines.append(f"• *{g.level}* `{_name(e.finding.dag_id, 100)}`: {escape(status_of(e.results).label)}")
    blocks = (section(_fit(lines, what="more groups")), links_context(DUPLICATE_ALERT, links))
    return Message(text=digest_outcome_text(ranked), blocks=blocks)


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

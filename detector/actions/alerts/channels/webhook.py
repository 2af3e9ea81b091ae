"""The generic JSON webhook channel (``DUPGUARD_WEBHOOK_URL``): one ``dupguard.alert/v1`` payload per group,
outcome, notice or storm digest part, for PagerDuty-, Opsgenie- or Teams-style receivers (the payload is
documented in docs/how-to/alerts.md).

The transport is ``json_webhook.JsonWebhook`` (timeouts, retries), shared with Alertmanager.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from functools import partial
from typing import Any

from detector.actions.alerts.channels.base import Needs
from detector.actions.alerts.group_text import (
    digest_outcome_text,
    digest_text,
    event_guidance,
    iso,
    plain_text,
    remediation_json,
    run_json,
    status_of,
    title,
    worst_first,
)
from detector.actions.alerts.json_webhook import JsonWebhook
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.parts import send_each
from detector.actions.alerts.text import SCHEMA, SUMMARY_LIMIT, clip
from detector.config import Config
from detector.core.model import Finding
from detector.core.ports import AlertEvent, AlertKind

# One webhook POST stays small for any receiver (PagerDuty's Events API takes 512 KB, many gateways
# 1 MB); a bigger storm is split into parts.
DIGEST_MAX_BYTES = 256_000
DIGEST_MAX_GROUPS = 100


_V1_WORDS = {"critical": "error"}  # the dupguard.alert/v1 envelope's word for it (as a notice's)
_RANKS = {"info": 0, "warning": 1, "error": 2}


def severity(event: AlertEvent) -> str:
    """The Slack level and the Alertmanager ``severity`` (``oncall.Guidance.severity``) in the envelope's
    words: ``error`` (critical) when the duplicate will run or ran, ``info`` when it was stopped in time."""
    level = event_guidance(event, None, event.results).severity
    return _V1_WORDS.get(level, level)


def group_json(event: AlertEvent, ui_url: str | None = None) -> dict[str, Any]:
    f: Finding = event.finding
    return {
        "key": f.key,
        "dag_id": f.dag_id,
        "kind": f.kind.value,
        "confidence": f.confidence.value,
        "assets": list(event.assets),
        "shared_event_ids": list(f.shared_event_ids),
        "run_after": iso(f.run_after),
        "partition_key": f.partition_key,
        "kept": run_json(f.kept, ui_url),
        "duplicates": [run_json(r, ui_url) for r in f.duplicates],
        "new_run_ids": list(event.new_runs),
        "detected_at": iso(event.detected_at),
        "outcome_at": iso(event.outcome_at),
        "observed_at": iso(event.observed_at),
        "may_repeat": event.unrecorded is not None,
    }


def webhook_payload(event: AlertEvent, ui_url: str | None = None) -> dict[str, Any]:
    """The ``dupguard.alert/v1`` payload of one group (``type`` detected or outcome); see docs/how-to/alerts.md."""
    summary = title(event) if event.kind is AlertKind.DETECTED else f"{title(event)}: {status_of(event.results).label}"
    return {
        "schema": SCHEMA,
        "type": event.kind.value,
        "severity": severity(event),
        "summary": clip(summary, SUMMARY_LIMIT),
        "dedup_key": event.finding.key,
        "cluster": event.cluster,
        "group": group_json(event, ui_url),
        "remediation": remediation_json(event),
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
    worst = max((severity(e) for e in events), key=_RANKS.__getitem__, default="info")
    if outcomes:
        summary, text = f"{len(events)} remediation outcomes on {cluster}", digest_outcome_text(worst_first(events))
    else:
        summary, text = f"{len(events)} duplicate DAG run groups on {cluster}", digest_text(events)
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
            | ({"remediation": remediation_json(e)} if outcomes else {})
            for e in events
        ],
        "text": text,
    }


class WebhookChannel:
    """The generic JSON webhook: one ``dupguard.alert/v1`` payload per group, outcome or digest."""

    name = "webhook"
    transport = None  # one transport only

    def __init__(self, hook: JsonWebhook, ui_url: str | None = None) -> None:
        self.hook, self.ui_url = hook, ui_url

    def detected(self, event: AlertEvent) -> None:
        self.hook.send(webhook_payload(event, self.ui_url))

    def outcome(self, event: AlertEvent) -> None:
        self.hook.send(webhook_payload(event, self.ui_url))

    def digest(self, events: Sequence[AlertEvent]) -> int:
        """Bounded parts (``digest_payloads``); outcomes the same way (``type`` digest_outcome), each
        group with its ``key`` for receivers that correlate by group."""
        return send_each((chunk, partial(self.hook.send, p)) for chunk, p in digest_payloads(events, self.ui_url))

    digest_outcomes = digest

    def notice(self, notice: Notice) -> None:
        self.hook.send(notice.payload)


def build(config: Config, needs: Needs) -> list[WebhookChannel]:
    if not config.webhook_url:
        return []
    hook = JsonWebhook(
        config.webhook_url,
        timeout=needs.timeout,
        retries=needs.retries,
        on_retry=needs.counter("webhook"),
        pace=needs.pace(),
    )
    return [WebhookChannel(hook, config.airflow_ui_url)]

"""The always-on alert sink: every group becomes one structured log event, with or without Slack.

``duplicate_detected`` carries every field of the group (a canonical log line: one rich event per
group); ``remediation_outcome`` carries what happened to each duplicate. Both are written
synchronously by ``Dispatcher.notify`` (a log write is cheap and cannot hang), so a group is on
record even if the process dies before Slack or the webhook took it, and even during a storm that
Slack only sees as a digest.

Always on, so it is no entry of the channel registry (``channels/__init__.py``): the dispatcher writes
it itself before it queues an alert for the registered channels.
"""

from __future__ import annotations

from typing import Any

from detector import logs
from detector.actions.alerts.group_text import iso, remediation_json, run_json, status_of
from detector.core.ports import AlertEvent, AlertKind

LOGGER = "dupguard.alerts"


def log_event(event: AlertEvent, ui_url: str | None = None) -> None:
    """Write ``event`` as ``duplicate_detected`` and/or ``remediation_outcome`` (when it carries results)."""
    log = logs.get(LOGGER)
    if event.kind is AlertKind.DETECTED:
        log.warning("duplicate_detected", **log_fields(event, ui_url))
        if not event.results:  # the daemon's first event has none (remediation follows off the loop)
            return
    fields = outcome_log_fields(event)
    status = status_of(event.results).name
    if status == "failed":
        log.error("remediation_outcome", **fields)
    elif status in ("caught_after_start", "unknown"):  # user code ran, or the stop is unproven: look
        log.warning("remediation_outcome", **fields)
    else:
        log.info("remediation_outcome", **fields)


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
        "run_after": iso(f.run_after),
        "partition_key": f.partition_key,
        "creating_job_ids": list(f.creating_job_ids),
        "creator_hostnames": [r.creator_hostname for r in f.runs],
        "runs": [run_json(r, ui_url) for r in f.runs],
        "duplicate_task_seconds": f.duplicate_task_seconds,
        "detected_at": iso(event.detected_at),
        "remediation_mode": event.mode,
        "cluster": event.cluster,
    }


def outcome_log_fields(event: AlertEvent) -> dict[str, Any]:
    f = event.finding
    rem = remediation_json(event)
    return {
        "group_key": f.key,
        "dag_id": f.dag_id,
        "kept_run": f.kept.run_id,
        "remediation_mode": event.mode,
        "status": rem["status"],
        "results": rem["results"],
        "cluster": event.cluster,
    }

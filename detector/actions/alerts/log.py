"""The always-on alert sink: every group becomes one structured log event, with or without Slack.

``duplicate_detected`` carries every field of the group (a canonical log line: one rich event per
group); ``remediation_outcome`` carries what happened to each duplicate. Both are written
synchronously by ``Dispatcher.notify`` (a log write is cheap and cannot hang), so a group is on
record even if the process dies before Slack or the webhook took it, and even during a storm that
Slack only sees as a digest.
"""

from __future__ import annotations

from detector import logs
from detector.actions.alerts.format import log_fields, outcome_log_fields, status_of
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

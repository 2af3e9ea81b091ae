"""What a periodic check's alert says, on every channel, from an ``Observation``'s fields alone.

A notice is what the dispatcher sends for anything that is not a duplicate group: it is claimed once
per channel under its ``key`` and never digested. ``Notice`` is the shape every channel reads (Slack
``message``, the webhook ``payload``, Alertmanager's ``alertname``/``am_severity``/``am_fields``, the
log line's ``log_fields`` as ``<kind>_detected``); ``ObservationNotice`` builds it for any kind, so a
new kind of check needs no alert code. The split partition keeps its own richer message
(``detector.checks.split_partition.alert``), which has the same shape.

Webhook payload: the ``dupguard.alert/v1`` envelope (``schema``, ``type`` = the kind, ``severity``,
``summary``, ``dedup_key``, ``cluster``, ``text``) with an ``observation`` object (the scan document's
entry for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from detector.actions.alerts.oncall import NO_LINKS, Guidance, Links, guidance_section, icon, links_context
from detector.actions.alerts.text import (
    SCHEMA,
    SUMMARY_LIMIT,
    TEXT_LIMIT,
    Message,
    clip,
    context,
    escape,
    header,
    section,
    slack_date,
)
from detector.core.checks import Observation

_LEVEL = {"error": "HIGH", "warning": "WARNING", "info": "INFO"}  # the Slack headline's words (oncall.icon)
_AM_SEVERITY = {"error": "critical", "warning": "warning", "info": "info"}
_LABEL_LIMIT = 250


@runtime_checkable
class Notice(Protocol):
    """One alert of a periodic check, ready for every channel (the dispatcher tells it from a group's
    alert with ``isinstance``)."""

    @property
    def key(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def alertname(self) -> str: ...
    @property
    def am_severity(self) -> str: ...
    @property
    def text(self) -> str: ...
    @property
    def payload(self) -> dict[str, Any]: ...
    @property
    def log_fields(self) -> dict[str, Any]: ...
    @property
    def cluster(self) -> str: ...

    def message(self, ui_url: str | None = None, links: Links | None = None) -> Message: ...

    def am_fields(self) -> tuple[dict[str, str], dict[str, str]]: ...  # extra labels, extra annotations


def alertname_of(kind: str) -> str:
    """``trigger_flapping`` -> ``DupguardTriggerFlapping`` (Alertmanager's alertname, the runbook anchor)."""
    return "Dupguard" + "".join(part.capitalize() for part in kind.split("_"))


@dataclass(frozen=True)
class ObservationNotice:
    observation: Observation
    cluster: str
    detected_at: datetime

    @property
    def key(self) -> str:
        return self.observation.key

    @property
    def kind(self) -> str:
        return self.observation.kind

    @property
    def alertname(self) -> str:
        return self.observation.alertname or alertname_of(self.observation.kind)

    @property
    def am_severity(self) -> str:
        return _AM_SEVERITY[self.observation.severity]

    @property
    def title(self) -> str:
        return f"{self.observation.title} on {self.cluster}"

    @property
    def text(self) -> str:
        obs = self.observation
        head = f"{obs.key}: {obs.confidence}, seen {obs.seen_at.isoformat()}, detected {self.detected_at.isoformat()}"
        return "\n".join([self.title, head, *obs.lines, obs.advice])

    @property
    def payload(self) -> dict[str, Any]:
        obs = self.observation
        return {
            "schema": SCHEMA,
            "type": obs.kind,
            "severity": obs.severity,
            "summary": clip(self.title, SUMMARY_LIMIT),
            "dedup_key": obs.key,
            "cluster": self.cluster,
            "observation": obs.as_dict(),
            "text": self.text,
        }

    @property
    def log_fields(self) -> dict[str, Any]:
        obs = self.observation
        common = {"group_key": obs.key, "detected_at": self.detected_at.isoformat(), "cluster": self.cluster}
        # structlog's own keys are left out: a kind's fact named "event" would break the log call
        skip = {"key", "lines", "advice", "event", "level", "timestamp", "logger"}
        return {k: v for k, v in obs.as_dict().items() if k not in skip} | common

    def message(self, ui_url: str | None = None, links: Links | None = None) -> Message:
        """Severity and what to do first, the evidence, then the runbook and the links."""
        obs = self.observation
        level = _LEVEL[obs.severity]
        advice = Guidance(level, f"{obs.confidence}: {obs.kind.replace('_', ' ')}", escape(obs.advice))
        dag_id = obs.dag_ids[0] if len(obs.dag_ids) == 1 else None
        blocks = (
            header(f"{icon(level)} {level}: {self.title}"),
            guidance_section(advice),
            section(escape("\n".join(obs.lines)) or "-"),
            links_context(self.alertname, links or NO_LINKS, ui_url, dag_id),
            context(
                f"{obs.confidence} · seen {slack_date(obs.seen_at)} · detected {slack_date(self.detected_at)} · "
                + escape(f"{obs.key} · dupguard")
            ),
        )
        return Message(text=escape(clip(f"{level}: {self.text}", TEXT_LIMIT)), blocks=blocks)

    def am_fields(self) -> tuple[dict[str, str], dict[str, str]]:
        obs = self.observation
        labels = {"dag_id": clip(obs.dag_ids[0], _LABEL_LIMIT)} if len(obs.dag_ids) == 1 else {}
        annotations = {"confidence": obs.confidence, "headline": obs.title, "advice": obs.advice}
        if obs.dag_ids:
            annotations["dag_ids"] = clip(", ".join(obs.dag_ids), TEXT_LIMIT)
        return labels, annotations


def observation_notice(obs: Observation, cluster: str, detected_at: datetime) -> ObservationNotice:
    return ObservationNotice(obs, cluster, detected_at)

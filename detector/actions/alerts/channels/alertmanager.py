"""Alertmanager (API v2, ``POST /api/v2/alerts``): each duplicate group and each split partition as an alert.

On-call routes, groups, silences and inhibits in Alertmanager; dupguard only says what is wrong,
in labels a route can match (docs/how-to/alerts.md, "Alertmanager"):

- ``alertname`` ``DupguardDuplicateRun`` (a group) or ``DupguardSplitPartition``; ``severity``
  (``severity_of``); ``cluster``; ``dag_id``; ``kind``; ``group_key`` (one alert per group, so two
  groups of one DAG are two alerts a route can group by ``dag_id``).
- annotations: ``summary``, ``description`` (the whole plain text), the run ids and their UI links,
  ``outcome``, ``runbook_url``.

Alertmanager forgets an alert at its ``endsAt`` (``resolve_timeout`` after the last push when none is
given), so, like Prometheus, dupguard pushes an open alert again every ``resend_interval`` with
``endsAt`` four intervals ahead: if dupguard stops, Alertmanager resolves it by itself. Once the
group's outcome is final (every duplicate has a result that is not retried) the alert gets a fixed
``endsAt``: ``resolve_after`` after its first push, or now if that has passed. Not now at once:
Alertmanager never notifies an alert that is already resolved when its group is first flushed
(``group_wait``), and a remediation usually ends within milliseconds of the detection. A new severity
is a new label set, so the alert of the old one is resolved in the same push. A split partition is
announced once, so its alert is final from the start.

One ``AlertmanagerChannel`` per URL (an HA pair gets every alert on every member: Alertmanager does
not share alerts between peers); the dispatcher retries, claims and counts each as its own channel.
The transport is ``json_webhook.JsonWebhook``, shared with the generic webhook channel.
"""

from __future__ import annotations

import base64
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Protocol

from detector import logs
from detector.actions.alerts.channels.base import Needs
from detector.actions.alerts.channels.log import LOGGER
from detector.actions.alerts.group_text import event_guidance, plain_text, status_of
from detector.actions.alerts.json_webhook import JsonWebhook
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.oncall import DUPLICATE_ALERT, Guidance, runbook_link
from detector.actions.alerts.parts import send_each
from detector.actions.alerts.text import SUMMARY_LIMIT, clip, run_url
from detector.config import RUNBOOK_URL, Config
from detector.core.ports import AlertEvent, AlertKind
from detector.errors import AlertDeliveryError

# Alertmanager takes any number per push; few pushes keep a storm's re-sends within the per-minute
# bound (``pace``): 10,000 open alerts are 10 pushes a minute, not 100.
MAX_ALERTS_PER_PUSH = 1000
MAX_OPEN = 10_000  # alerts kept for re-sending; beyond, the oldest is left to expire in Alertmanager
_TEXT_LIMIT = 4000  # an annotation is shown in chat receivers, which cut long texts anyway


class Poster(Protocol):
    """The transport (``JsonWebhook``): delivers one JSON body or raises ``AlertDeliveryError``."""

    def send(self, payload: Any) -> None: ...


def _guidance(event: AlertEvent) -> Guidance:
    return event_guidance(event, None, event.results)


def severity_of(event: AlertEvent) -> str:
    """The Slack message's level (``oncall.guidance``) in Alertmanager's words: ``critical`` when a
    duplicate will run (not stopped: dry-run, off, kept before, a stop not confirmed or failed) or ran
    (too late, caught after start), ``warning`` instead when ``DUPGUARD_UNSTOPPED_SEVERITY`` lowers it;
    ``info`` when nothing is left to do (stopped or gone before its tasks ran); ``warning`` for a
    confirmed duplicate being stopped and for a suspected one."""
    return _guidance(event).severity


def is_final(event: AlertEvent) -> bool:
    """Every duplicate of the group has a result no retry will change."""
    return event.kind is AlertKind.OUTCOME and bool(event.results) and not any(r.retryable for r in event.results)


@dataclass(frozen=True)
class Alert:
    """One alert of one group (``key``) as Alertmanager's ``postableAlert`` needs it, but its times."""

    key: str
    labels: dict[str, str]
    annotations: dict[str, str]
    final: bool
    generator_url: str | None = None


def group_alert(event: AlertEvent, ui_url: str | None = None, runbook: str = RUNBOOK_URL) -> Alert:
    f = event.finding
    status = status_of(event.results)
    annotations = {
        "summary": clip(plain_text(event).splitlines()[0], SUMMARY_LIMIT),
        "description": clip(plain_text(event, ui_url), _TEXT_LIMIT),
        "outcome": status.name,
        "outcome_detail": status.label,
        "headline": _guidance(event).headline,
        "confidence": f.confidence.value,
        "remediation_mode": event.mode,
        "run_after": f.run_after.isoformat(),
        "kept_run": f.kept.run_id,
        "duplicate_runs": clip(", ".join(r.run_id for r in f.duplicates), _TEXT_LIMIT),
        "runbook_url": runbook_link(runbook, DUPLICATE_ALERT),
    }
    if f.partition_key is not None:
        annotations["partition_key"] = f.partition_key
    if event.assets:
        annotations["assets"] = clip(", ".join(event.assets), _TEXT_LIMIT)
    kept_url = run_url(ui_url, f.dag_id, f.kept.run_id)
    if kept_url:
        annotations["kept_run_url"] = kept_url
        urls = (run_url(ui_url, r.dag_id, r.run_id) or "" for r in f.duplicates)
        annotations["duplicate_run_urls"] = clip("\n".join(urls), _TEXT_LIMIT)
    labels = {
        "alertname": DUPLICATE_ALERT,
        "severity": severity_of(event),
        "cluster": event.cluster,
        "dag_id": f.dag_id,
        "kind": f.kind.value,
        "group_key": f.key,
    }
    return Alert(f.key, labels, annotations, final=is_final(event), generator_url=kept_url)


def notice_alert(notice: Notice, runbook: str = RUNBOOK_URL) -> Alert:
    """A periodic check's alert (a split partition, a flapping trigger, ...): final at once, it describes a
    state someone must look at; its severity is the notice's (a split: always ``warning``)."""
    extra_labels, extra_annotations = notice.am_fields()
    labels = {
        "alertname": notice.alertname,
        "severity": notice.am_severity,
        "cluster": notice.cluster,
        **extra_labels,
        "kind": notice.kind,
        "group_key": notice.key,
    }
    annotations = {
        "summary": notice.payload["summary"],
        "description": clip(notice.text, _TEXT_LIMIT),
        **extra_annotations,
        "runbook_url": runbook_link(runbook, notice.alertname),
    }
    return Alert(notice.key, labels, annotations, final=True)


split_alert = notice_alert  # the split partition's name for it, kept for callers of 0.x


@dataclass(frozen=True)
class _Tracked:
    alert: Alert
    starts_at: datetime  # of this label set
    first_push: datetime  # of the group, whatever its label sets
    ends_at: datetime | None  # fixed once final; None: open, pushed with a moving endsAt


def _wire(alert: Alert, starts_at: datetime, ends_at: datetime) -> dict[str, Any]:
    body: dict[str, Any] = {
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": starts_at.isoformat(),
        "endsAt": ends_at.isoformat(),
    }
    if alert.generator_url:
        body["generatorURL"] = alert.generator_url
    return body


class Tracker:
    """The alerts dupguard still pushes, and what each push says. Pure: ``now`` is passed in."""

    def __init__(self, resend_interval: timedelta, resolve_after: timedelta) -> None:
        self.ttl = resend_interval * 4  # Prometheus' choice: three re-sends may be lost before it resolves
        self.resolve_after = resolve_after
        self._alerts: dict[str, _Tracked] = {}

    def __len__(self) -> int:
        return len(self._alerts)

    def track(self, alert: Alert, now: datetime) -> list[dict[str, Any]]:
        """The body that announces ``alert``: it, and the group's previous label set resolved if it changed."""
        body = []
        old = self._alerts.pop(alert.key, None)
        first = old.first_push if old else now
        starts = old.starts_at if old and old.alert.labels == alert.labels else now
        if old and old.alert.labels != alert.labels:
            body.append(_wire(old.alert, old.starts_at, now))
        ends = max(now, first + self.resolve_after) if alert.final else None
        tracked = _Tracked(alert, starts, first, ends)
        body.append(self._wire(tracked, now))
        if ends is None or ends > now:
            self._alerts[alert.key] = tracked
            while len(self._alerts) > MAX_OPEN:
                self._alerts.pop(next(iter(self._alerts)))
        return body

    def due(self, now: datetime) -> list[dict[str, Any]]:
        """The body of a re-send: every tracked alert (an Alertmanager that restarted or missed a push
        learns it again); an alert whose fixed end has passed is sent resolved one last time, then dropped."""
        body = [self._wire(t, now) for t in self._alerts.values()]
        for key in [k for k, t in self._alerts.items() if t.ends_at is not None and t.ends_at <= now]:
            del self._alerts[key]
        return body

    def _wire(self, tracked: _Tracked, now: datetime) -> dict[str, Any]:
        return _wire(tracked.alert, tracked.starts_at, tracked.ends_at or now + self.ttl)


def _group_keys(part: list[dict[str, Any]]) -> list[str]:
    """The groups a push carries, once each, in order (a group may have two alerts in it)."""
    return list(dict.fromkeys(str(wire["labels"].get("group_key")) for wire in part))


def _chunks(body: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [body[i : i + MAX_ALERTS_PER_PUSH] for i in range(0, len(body), MAX_ALERTS_PER_PUSH)]


class AlertmanagerChannel:
    """One Alertmanager: pushes on the dispatcher's worker, re-sends on its own thread.

    Every push, first or again, goes through one lock, so a re-send never lands after (and undoes)
    the newer push of the same group. A failed re-send is logged and counted (``on_failure``); the
    next one carries the alert again.
    """

    transport = None  # one transport only

    def __init__(
        self,
        name: str,
        poster: Poster,
        *,
        resend_interval: timedelta,
        resolve_after: timedelta,
        ui_url: str | None = None,
        runbook: str = RUNBOOK_URL,
        on_failure: Callable[[str], None] = lambda error: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.name, self.poster, self.ui_url, self.runbook = name, poster, ui_url, runbook
        self.interval = resend_interval.total_seconds()
        self.tracker = Tracker(resend_interval, resolve_after)
        self.on_failure, self.clock = on_failure, clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def detected(self, event: AlertEvent) -> None:
        self._push([group_alert(event, self.ui_url, self.runbook)])

    def outcome(self, event: AlertEvent) -> None:
        self.detected(event)

    def digest(self, events: Sequence[AlertEvent]) -> int:
        """A storm needs no digest here (Alertmanager groups): every group's alert, 1,000 to a push,
        each push sent also after one failed (``PartialDelivery`` names each failed push's groups)."""
        return self._push([group_alert(e, self.ui_url, self.runbook) for e in events], events)

    def digest_outcomes(self, events: Sequence[AlertEvent]) -> int:
        return self.digest(events)

    def notice(self, notice: Notice) -> None:
        self._push([notice_alert(notice, self.runbook)])

    def _push(self, alerts: list[Alert], events: Sequence[AlertEvent] = ()) -> int:
        """Tracked before it is sent: an alert whose push failed goes out with the next re-send.
        With ``events`` (a digest's), every push is attempted and a failed one reported with the
        events whose alerts it carried; without, the first failure raises."""
        with self._lock:
            now = self.clock()
            parts = _chunks([wire for alert in alerts for wire in self.tracker.track(alert, now)])
            if self._thread is None and len(self.tracker) and not self._stop.is_set():
                self._thread = threading.Thread(target=self._resend_loop, name=f"dupguard-{self.name}", daemon=True)
                self._thread.start()
            if events:
                by_key = {e.finding.key: e for e in events}
                return send_each(
                    ([by_key[k] for k in _group_keys(part) if k in by_key], partial(self.poster.send, part))
                    for part in parts
                )
            for part in parts:
                self.poster.send(part)
        return len(parts)

    def _resend_loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.resend()

    def resend(self) -> None:
        """Push every tracked alert again (the thread's job; tests call it to skip the wait)."""
        with self._lock:
            body = self.tracker.due(self.clock())
            try:
                for part in _chunks(body):
                    self.poster.send(part)
            except AlertDeliveryError as exc:
                self.on_failure(str(exc))
                logs.get(LOGGER).warning("alert_resend_failed", channel=self.name, alerts=len(body), error=str(exc))

    def close(self, timeout: float = 1.0) -> None:
        """Stop re-sending (the open alerts end in Alertmanager at their last ``endsAt``); a re-send
        under way gets ``timeout`` seconds (the thread is a daemon: shutdown does not wait for more)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


def channel_names(urls: Sequence[str]) -> list[str]:
    """``alertmanager`` for one URL; ``alertmanager-1``, ``alertmanager-2`` … for an HA set."""
    return ["alertmanager"] if len(urls) == 1 else [f"alertmanager-{i}" for i in range(1, len(urls) + 1)]


def auth_headers(config: Config) -> dict[str, str]:
    """Basic auth or a bearer token (detector/config/cross_checks.py allows one of them), as Alertmanager's
    ``--web.config.file`` or a proxy in front of it asks."""
    if config.alertmanager_bearer_token:
        return {"Authorization": f"Bearer {config.alertmanager_bearer_token}"}
    if config.alertmanager_username and config.alertmanager_password:
        pair = f"{config.alertmanager_username}:{config.alertmanager_password}".encode()
        return {"Authorization": "Basic " + base64.b64encode(pair).decode()}
    return {}


def tls_context(config: Config) -> ssl.SSLContext:
    """The system's CAs, or ``DUPGUARD_ALERTMANAGER_CA_BUNDLE``'s; no verification when it is turned off."""
    context = ssl.create_default_context(cafile=config.alertmanager_ca_bundle)
    if not config.alertmanager_verify_tls:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _failed_resend(
    count: Callable[[], None], undelivered: Callable[[str, str], None], name: str
) -> Callable[[str], None]:
    def failed(error: str) -> None:
        count()
        undelivered(name, error)

    return failed


def build(config: Config, needs: Needs) -> list[AlertmanagerChannel]:
    """One channel per ``DUPGUARD_ALERTMANAGER_URLS`` entry; its retries and its failed re-sends are
    counted in ``dupguard_alerts_total``, and a failed re-send is recorded where ``/readyz`` names the
    other undelivered alerts (``needs.undelivered``: the dispatcher's ``trouble``)."""
    headers, context = auth_headers(config), tls_context(config)
    return [
        AlertmanagerChannel(
            name,
            JsonWebhook(
                f"{url}/api/v2/alerts",
                timeout=needs.timeout,
                retries=needs.retries,
                on_retry=needs.counter(name, "retried"),
                name=name,
                headers=headers,
                context=context,
                pace=needs.pace(),
            ),
            resend_interval=config.alertmanager_resend_interval,
            resolve_after=config.alertmanager_resolve_after,
            ui_url=config.airflow_ui_url,
            runbook=config.runbook_url or RUNBOOK_URL,
            on_failure=_failed_resend(needs.counter(name, "failed"), needs.undelivered, name),
        )
        for name, url in zip(channel_names(config.alertmanager_urls), config.alertmanager_urls, strict=True)
    ]

"""The ``Alerter``: logs every group at once, then delivers to Slack and the webhook off the detection path.

Threads::

    notify() ──log event (sync)──► inbound queue ──► router thread ──► one queue + worker per channel
                                                     (storm → digest)     (claim, send, remember)

``notify`` writes the ``duplicate_detected`` / ``remediation_outcome`` log event and enqueues; it
never waits for the network, so a hanging Slack cannot delay detection or remediation. Each channel
has its own worker, so a slow Slack does not hold up the webhook either.

Storms: when more than ``storm_threshold`` DETECTED groups arrive within ``storm_window`` seconds,
the router opens a digest: groups arriving in the next ``digest_delay`` seconds go out as one
message, and outcomes of those groups are held and sent as one follow-up after it; outcomes of
digested groups that come later (a remediation takes its time) are gathered for ``digest_delay``
seconds and sent as one follow-up too, never one message per group.

Counting: ``dupguard_alerts_total{outcome="sent"}`` counts the messages and payloads that were
delivered; a digest too big for one webhook payload is several, and each part that cannot be
delivered is counted ``failed`` and logged ``alert_undelivered`` with its own groups, while the
other parts are still sent. Undelivered alerts of the last 15 minutes are named by ``trouble()``
(``/readyz``'s body).

Exactly once per channel: before a channel sends a group's first alert it claims
``(group_key, "alert:<channel>")`` in the ledger; a lost claim (another replica, or this group
before a restart) is counted ``deduplicated`` and nothing is sent. Outcomes claim
``alert:<channel>:outcome:<signature>``, so the same outcome is announced once but a later, different
one is too. The claim is taken before sending, so delivery is at most once per channel; an alert that
cannot be delivered is logged as ``alert_undelivered`` with its whole text, and counted ``failed``.
If the ledger itself fails, the alert is sent anyway (a possible repeat beats silence).

Secrets never reach a log: channels are named ("slack", "webhook"), transports raise errors that
hold no URL or token, and only those messages are logged.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from slack_sdk import WebClient
from slack_sdk.webhook import WebhookClient

from detector import logs
from detector.actions.alerts.alertmanager import AlertmanagerChannel
from detector.actions.alerts.alertmanager import build_channels as alertmanager_channels
from detector.actions.alerts.format import (
    detected_message,
    digest_message,
    digest_outcome_message,
    digest_payloads,
    joined_signature,
    outcome_message,
    outcome_signature,
    plain_text,
    webhook_payload,
)
from detector.actions.alerts.log import LOGGER, log_event
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.oncall import NO_LINKS, Links
from detector.actions.alerts.parts import PartialDelivery, send_each
from detector.actions.alerts.slack import (
    Posted,
    SlackBot,
    SlackWebhook,
    make_web_client,
    make_webhook_client,
)
from detector.actions.alerts.webhook import JsonWebhook
from detector.config import Config
from detector.core.ports import AlertEvent, AlertKind, Ledger
from detector.metrics import Metrics

SLACK_TS = "slack_ts"
SLACK_CHANNEL_ID = "slack_channel_id"
SLACK_DIGEST = "slack_digest"
DIGESTED_KEPT = 100_000  # digested groups whose later outcomes are digested too
TROUBLE_WINDOW = 900.0  # seconds an undelivered alert stays named in /readyz


# --- work items -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Single:
    event: AlertEvent


@dataclass(frozen=True)
class Digest:
    events: tuple[AlertEvent, ...]


@dataclass(frozen=True)
class DigestOutcomes:
    events: tuple[AlertEvent, ...]


Item = Single | Digest | DigestOutcomes | Notice
_STOP = object()


def _describe(item: Item) -> tuple[str, list[str], list[AlertEvent]]:
    if isinstance(item, Notice):
        return item.kind, [item.key], []
    if isinstance(item, Single):
        return item.event.kind.value, [item.event.finding.key], [item.event]
    kind = "digest" if isinstance(item, Digest) else "digest_outcomes"
    return kind, [e.finding.key for e in item.events], list(item.events)


# --- channels -------------------------------------------------------------------------------------


class Channel(Protocol):
    """One destination. Each method delivers or raises (``AlertDeliveryError`` when the cause is known);
    the digest methods return how many messages or payloads they sent, and raise ``PartialDelivery``
    when some of them failed."""

    name: str

    def detected(self, event: AlertEvent) -> None: ...

    def outcome(self, event: AlertEvent) -> None: ...

    def digest(self, events: Sequence[AlertEvent]) -> int: ...

    def digest_outcomes(self, events: Sequence[AlertEvent]) -> int: ...

    def notice(self, notice: Notice) -> None: ...


class SlackBotChannel:
    """First message in the channel; outcomes threaded under it, and the first message updated to show them.

    The message ts and channel id live in the ledger (``slack_ts``, ``slack_channel_id``), so a
    restarted or other replica still threads its follow-ups under the right message.
    """

    name = "slack"

    def __init__(self, bot: SlackBot, ledger: Ledger, ui_url: str | None = None, links: Links = NO_LINKS) -> None:
        self.bot, self.ledger, self.ui_url, self.links = bot, ledger, ui_url, links

    def _remember(self, key: str, posted: Posted, digest: bool = False) -> None:
        try:
            self.ledger.remember(key, SLACK_TS, posted.ts)
            self.ledger.remember(key, SLACK_CHANNEL_ID, posted.channel_id)
            if digest:
                self.ledger.remember(key, SLACK_DIGEST, posted.ts)
        except Exception:  # noqa: BLE001 - the message is out; only its follow-ups lose their thread
            logs.get(LOGGER).exception("alert_thread_not_remembered", channel=self.name, group_key=key)

    def _thread(self, key: str) -> Posted | None:
        ts = self.ledger.recall(key, SLACK_TS)
        if ts is None:
            return None
        return Posted(self.ledger.recall(key, SLACK_CHANNEL_ID) or self.bot.channel, ts)

    def detected(self, event: AlertEvent) -> None:
        self._remember(event.finding.key, self.bot.post(detected_message(event, self.ui_url, links=self.links)))

    def outcome(self, event: AlertEvent) -> None:
        key = event.finding.key
        first = self._thread(key)
        if first is None:  # announced by no one we know of (e.g. a memory ledger after a restart)
            self.bot.post(outcome_message(event, self.ui_url, threaded=False, links=self.links))
            return
        reply = outcome_message(event, self.ui_url, links=self.links)
        self.bot.post(reply, thread_ts=first.ts, channel=first.channel_id)
        if self.ledger.recall(key, SLACK_DIGEST) is None:
            self.bot.update(first, detected_message(event, self.ui_url, event.results, links=self.links))

    def digest(self, events: Sequence[AlertEvent]) -> int:
        posted = self.bot.post(digest_message(events, self.ui_url, links=self.links))
        for e in events:
            self._remember(e.finding.key, posted, digest=True)
        return 1

    def digest_outcomes(self, events: Sequence[AlertEvent]) -> int:
        threads: dict[Posted | None, list[AlertEvent]] = {}
        for e in events:
            threads.setdefault(self._thread(e.finding.key), []).append(e)
        return send_each((group, partial(self._reply, first, group)) for first, group in threads.items())

    def _reply(self, first: Posted | None, group: Sequence[AlertEvent]) -> None:
        if first is None:
            self.bot.post(digest_outcome_message(group, links=self.links))
        else:
            self.bot.post(digest_outcome_message(group, links=self.links), thread_ts=first.ts, channel=first.channel_id)

    def notice(self, notice: Notice) -> None:
        self.bot.post(notice.message(self.ui_url, self.links))


class SlackWebhookChannel:
    """An incoming webhook: one message per group, follow-ups as new messages naming the group."""

    name = "slack"

    def __init__(self, hook: SlackWebhook, ui_url: str | None = None, links: Links = NO_LINKS) -> None:
        self.hook, self.ui_url, self.links = hook, ui_url, links

    def detected(self, event: AlertEvent) -> None:
        self.hook.send(detected_message(event, self.ui_url, links=self.links))

    def outcome(self, event: AlertEvent) -> None:
        self.hook.send(outcome_message(event, self.ui_url, threaded=False, links=self.links))

    def digest(self, events: Sequence[AlertEvent]) -> int:
        self.hook.send(digest_message(events, self.ui_url, links=self.links))
        return 1

    def digest_outcomes(self, events: Sequence[AlertEvent]) -> int:
        self.hook.send(digest_outcome_message(events, links=self.links))
        return 1

    def notice(self, notice: Notice) -> None:
        self.hook.send(notice.message(self.ui_url, self.links))


class WebhookChannel:
    """The generic JSON webhook: one ``dupguard.alert/v1`` payload per group, outcome or digest."""

    name = "webhook"

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


# --- the dispatcher -------------------------------------------------------------------------------


@dataclass(eq=False)
class _Lane:
    channel: Channel
    queue: queue.Queue[Any] = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    current: Item | None = None
    reported: Item | None = None  # the in-flight item close() already logged as undelivered


class Undelivered:
    """Which channels left alerts undelivered lately, and why the latest did: the dispatcher's own
    failures and an Alertmanager channel's failed re-sends (its own thread) alike, for ``trouble``."""

    def __init__(self) -> None:
        self._times: dict[str, deque[float]] = {}  # channel -> when its alerts went undelivered lately
        self._last: dict[str, str] = {}  # channel -> why the latest did

    def add(self, channel: str, error: str) -> None:
        self._times.setdefault(channel, deque(maxlen=10_000)).append(time.monotonic())
        self._last[channel] = error

    def describe(self) -> str | None:
        shown = []
        for name, times in sorted(self._times.items()):
            recent = [t for t in list(times) if t > time.monotonic() - TROUBLE_WINDOW]
            if recent:
                why = self._last.get(name, "")
                shown.append(f"{name}: {len(recent)} in the last {TROUBLE_WINDOW / 60:g} min (latest: {why})")
        return "; ".join(shown) or None


class Dispatcher:
    """The ``Alerter``: see the module docstring."""

    def __init__(
        self,
        channels: Sequence[Channel],
        ledger: Ledger,
        metrics: Metrics,
        *,
        ui_url: str | None = None,
        storm_threshold: int = 5,
        storm_window: float = 60.0,
        digest_delay: float = 10.0,
        undelivered: Undelivered | None = None,
    ) -> None:
        self.ledger, self.metrics, self.ui_url = ledger, metrics, ui_url
        self.storm_threshold, self.storm_window, self.digest_delay = storm_threshold, storm_window, digest_delay
        self._lanes = [_Lane(c) for c in channels]
        self._inbound: queue.Queue[Any] = queue.Queue()
        self._arrivals: deque[float] = deque()
        self._digest: list[AlertEvent] | None = None
        self._digest_deadline: float | None = None
        self._held: list[AlertEvent] = []
        # groups sent in a digest lately -> their outcomes are digested too (bounded: a storm's worth)
        self._digested: OrderedDict[str, None] = OrderedDict()
        self._late: list[AlertEvent] = []  # outcomes of digested groups, after their digest went out
        self._late_deadline: float | None = None
        self._undelivered_lately = undelivered or Undelivered()
        self._closed = False
        self._abandoned = False
        self._router: threading.Thread | None = None
        if self._lanes:
            self._router = threading.Thread(target=self._route_loop, name="dupguard-alerts", daemon=True)
            self._router.start()
            for lane in self._lanes:
                lane.thread = threading.Thread(
                    target=self._work, args=(lane,), name=f"dupguard-alerts-{lane.channel.name}", daemon=True
                )
                lane.thread.start()

    @property
    def channel_names(self) -> list[str]:
        return [lane.channel.name for lane in self._lanes]

    def trouble(self) -> str | None:
        """Channels with alerts undelivered in the last ``TROUBLE_WINDOW`` seconds, and the latest
        reason (None: none). Shown in ``/readyz``'s body, which stays green: detection goes on."""
        return self._undelivered_lately.describe()

    # -- Alerter -----------------------------------------------------------------------------------

    def notify(self, event: AlertEvent) -> None:
        """Log ``event`` now and queue it for every channel. Returns at once; never raises."""
        try:
            log_event(event, self.ui_url)
        except Exception:  # noqa: BLE001 - notify must never break detection
            logs.get(LOGGER).exception("alert_log_failed", group_key=event.finding.key)
        try:
            if self._lanes and not self._closed:
                self._inbound.put_nowait(event)
            elif self._lanes:
                for lane in self._lanes:
                    self._undelivered(lane.channel, Single(event), "the alerter is closed")
        except Exception:  # noqa: BLE001 - notify must never break detection
            logs.get(LOGGER).exception("alert_notify_failed", group_key=event.finding.key)

    def notify_notice(self, notice: Notice) -> None:
        """Log a periodic check's notice now (``<kind>_detected``) and queue it for every channel (no
        digest). Never raises."""
        try:
            logs.get(LOGGER).warning(f"{notice.kind}_detected", **notice.log_fields)
        except Exception:  # noqa: BLE001 - a log line that fails must not keep the alert from the channels
            logs.get(LOGGER).exception("alert_log_failed", group_key=notice.key)
        try:
            if self._lanes and not self._closed:
                self._inbound.put_nowait(notice)
            elif self._lanes:
                for lane in self._lanes:
                    self._undelivered(lane.channel, notice, "the alerter is closed")
        except Exception:  # noqa: BLE001 - notify must never break detection
            logs.get(LOGGER).exception("alert_notify_failed", group_key=notice.key)

    def close(self, timeout: float) -> None:
        """Send what is queued (a pending digest at once) within ``timeout`` s; log the rest undelivered."""
        if self._closed:
            return
        self._closed = True
        if self._router is None:
            return
        deadline = time.monotonic() + timeout
        self._inbound.put(_STOP)
        for t in [self._router, *(lane.thread for lane in self._lanes)]:
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))
        for lane in self._lanes:  # Alertmanager's re-sends: its open alerts then end at their last endsAt
            if isinstance(lane.channel, AlertmanagerChannel):
                lane.channel.close(max(0.0, deadline - time.monotonic()))
        if not any(t is not None and t.is_alive() for t in [self._router, *(lane.thread for lane in self._lanes)]):
            return
        self._abandoned = True
        leftovers: list[Item] = []
        while True:  # events the router never got to
            try:
                event = self._inbound.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, AlertEvent):
                leftovers.append(Single(event))
            elif isinstance(event, Notice):
                leftovers.append(event)
        for lane in self._lanes:
            for item in leftovers:
                self._undelivered(lane.channel, item, "not sent before shutdown")
            while True:
                try:
                    item = lane.queue.get_nowait()
                except queue.Empty:
                    break
                if item is not _STOP:
                    self._undelivered(lane.channel, item, "not sent before shutdown")
            lane.queue.put(_STOP)  # the worker, once unstuck, must still find its way out
            current = lane.current
            if current is not None:
                lane.reported = current
                self._undelivered(lane.channel, current, "still being sent at shutdown, may not arrive")

    # -- router ------------------------------------------------------------------------------------

    def _route_loop(self) -> None:
        while True:
            due = [d for d in (self._digest_deadline, self._late_deadline) if d is not None]
            wait = max(0.0, min(due) - time.monotonic()) if due else None
            try:
                event = self._inbound.get(timeout=wait)
            except queue.Empty:
                event = None
            if event is _STOP:
                self._flush_digest()
                self._flush_late()
                for lane in self._lanes:
                    lane.queue.put(_STOP)
                return
            try:
                if isinstance(event, AlertEvent):
                    self._route(event)
                elif isinstance(event, Notice):
                    self._forward(event)
                if self._digest_deadline is not None and time.monotonic() >= self._digest_deadline:
                    self._flush_digest()
                if self._late_deadline is not None and time.monotonic() >= self._late_deadline:
                    self._flush_late()
            except Exception:  # noqa: BLE001 - the router must outlive any bad event
                logs.get(LOGGER).exception("alert_routing_failed")

    def _route(self, event: AlertEvent) -> None:
        now = time.monotonic()
        if event.kind is AlertKind.OUTCOME:
            if self._digest is not None and any(e.finding.key == event.finding.key for e in self._digest):
                self._held.append(event)  # sent after the digest, so it can thread under it
            elif event.finding.key in self._digested:
                self._late.append(event)
                if self._late_deadline is None:
                    self._late_deadline = now + self.digest_delay
            else:
                self._forward(Single(event))
            return
        self._arrivals.append(now)
        while self._arrivals and self._arrivals[0] <= now - self.storm_window:
            self._arrivals.popleft()
        if self._digest is not None:
            self._digest.append(event)
        elif len(self._arrivals) > self.storm_threshold:
            logs.get(LOGGER).warning(
                "alert_storm", groups_last_window=len(self._arrivals), window_seconds=self.storm_window
            )
            self._digest = [event]
            self._digest_deadline = now + self.digest_delay
        else:
            self._forward(Single(event))

    def _flush_digest(self) -> None:
        if self._digest:
            self._forward(Digest(tuple(self._digest)))
            for e in self._digest:
                self._digested[e.finding.key] = None
            while len(self._digested) > DIGESTED_KEPT:
                self._digested.popitem(last=False)
        if self._held:
            self._forward(DigestOutcomes(tuple(self._held)))
        self._digest, self._digest_deadline, self._held = None, None, []

    def _flush_late(self) -> None:
        if self._late:
            self._forward(DigestOutcomes(tuple(self._late)))
        self._late, self._late_deadline = [], None

    def _forward(self, item: Item) -> None:
        for lane in self._lanes:
            lane.queue.put(item)

    # -- workers -----------------------------------------------------------------------------------

    def _work(self, lane: _Lane) -> None:
        while True:
            item = lane.queue.get()
            if item is _STOP:
                return
            if self._abandoned:
                self._undelivered(lane.channel, item, "not sent before shutdown")
                continue
            lane.current = item
            try:
                self._deliver(lane.channel, item)
            except Exception as exc:  # noqa: BLE001 - a failed alert is logged, never fatal
                if lane.reported is not item:
                    self._undelivered(lane.channel, item, str(exc) or type(exc).__name__)
            finally:
                lane.current = None

    def _claim_key(self, channel: Channel, key: str, subject: str, alert: str) -> bool:
        """``_claim`` for an alert that is not an ``AlertEvent`` (a periodic check's notice)."""
        try:
            won = self.ledger.claim(key, subject)
        except Exception:  # noqa: BLE001 - without a ledger, alert anyway: a repeat beats silence
            logs.get(LOGGER).exception("alert_claim_failed", channel=channel.name, group_key=key)
            return True
        if not won:
            self.metrics.alerts.labels(channel=channel.name, outcome="deduplicated").inc()
            logs.get(LOGGER).info("alert_deduplicated", channel=channel.name, alert=alert, group_key=key)
        return won

    def _claim(self, channel: Channel, event: AlertEvent) -> AlertEvent | None:
        """``event`` to send (marked as possibly repeating when the ledger failed), or None: claimed before."""
        subject = f"alert:{channel.name}"
        if event.kind is AlertKind.OUTCOME:
            subject += f":outcome:{outcome_signature(event)}"
        elif event.new_runs:
            subject += f":joined:{joined_signature(event)}"
        try:
            won = self.ledger.claim(event.finding.key, subject)
        except Exception as exc:  # noqa: BLE001 - without a ledger, alert anyway: a repeat beats silence
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
            logs.get(LOGGER).warning(
                "alert_claim_failed", channel=channel.name, group_key=event.finding.key, error=reason
            )
            return replace(event, unrecorded=event.unrecorded or reason)
        if not won:
            self.metrics.alerts.labels(channel=channel.name, outcome="deduplicated").inc()
            logs.get(LOGGER).info(
                "alert_deduplicated", channel=channel.name, alert=event.kind.value, group_key=event.finding.key
            )
            return None
        return event

    def _deliver(self, channel: Channel, item: Item) -> None:
        if isinstance(item, Notice):
            if not self._claim_key(channel, item.key, f"alert:{channel.name}", item.kind):
                return
            channel.notice(item)
        elif isinstance(item, Single):
            event = self._claim(channel, item.event)
            if event is None:
                return
            if event.kind is AlertKind.DETECTED:
                channel.detected(event)
            else:
                channel.outcome(event)
        else:
            claimed = tuple(e for e in (self._claim(channel, e) for e in item.events) if e is not None)
            if not claimed:
                return
            part = Digest if isinstance(item, Digest) else DigestOutcomes
            item = part(claimed)
            try:
                sent = channel.digest(claimed) if part is Digest else channel.digest_outcomes(claimed)
            except PartialDelivery as exc:
                self._sent(channel, item, exc.sent)
                for events, error in exc.failed:
                    self._undelivered(channel, part(events), error)
                return
            self._sent(channel, item, sent)
            return
        self._sent(channel, item, 1)

    def _sent(self, channel: Channel, item: Item, payloads: int) -> None:
        if not payloads:
            return
        kind, keys, _ = _describe(item)
        self.metrics.alerts.labels(channel=channel.name, outcome="sent").inc(payloads)
        logs.get(LOGGER).info(
            "alert_sent", channel=channel.name, alert=kind, groups=len(keys), payloads=payloads, group_keys=keys[:20]
        )

    def _undelivered(self, channel: Channel, item: Item, error: str) -> None:
        kind, keys, events = _describe(item)
        self._undelivered_lately.add(channel.name, error)
        self.metrics.alerts.labels(channel=channel.name, outcome="failed").inc()
        logs.get(LOGGER).error(
            "alert_undelivered",
            channel=channel.name,
            alert=kind,
            group_keys=keys,
            error=error,
            content=item.text if isinstance(item, Notice) else "\n\n".join(plain_text(e, self.ui_url) for e in events),
        )


def build_alerter(
    config: Config,
    ledger: Ledger,
    metrics: Metrics,
    *,
    web_client: WebClient | None = None,
    webhook_client: WebhookClient | None = None,
    json_webhook: JsonWebhook | None = None,
    retries: int = 2,
    digest_delay: float = 10.0,
    storm_window: float = 60.0,
) -> Dispatcher:
    """The daemon's Alerter for ``config``: the log sink always, Slack (bot, else webhook) and the webhook if set.

    Clients may be injected (tests); otherwise they are built from the config with its timeout.
    """
    log = logs.get(LOGGER)
    timeout = config.alert_timeout.total_seconds()
    ui = config.airflow_ui_url

    def counter(name: str) -> Callable[[], None]:
        return metrics.alerts.labels(channel=name, outcome="retried").inc

    channels: list[Channel] = []
    undelivered = Undelivered()  # shared with the Alertmanager channels: their re-sends fail on their own thread
    slack_transport: str | None = None
    if config.slack_bot_token and config.slack_channel:
        slack_transport = "bot"
        client = web_client or make_web_client(
            config.slack_bot_token,
            api_url=config.slack_api_url,
            timeout=timeout,
            on_retry=counter("slack"),
            retries=retries,
        )
        channels.append(SlackBotChannel(SlackBot(client, config.slack_channel), ledger, ui, Links.of(config)))
        if config.slack_webhook_url:
            log.warning("alert_transport_ignored", transport="slack_webhook", reason="a bot token is configured")
    elif config.slack_webhook_url:
        slack_transport = "webhook"
        hook = webhook_client or make_webhook_client(
            config.slack_webhook_url, timeout=timeout, on_retry=counter("slack"), retries=retries
        )
        channels.append(SlackWebhookChannel(SlackWebhook(hook), ui, Links.of(config)))
    if config.webhook_url:
        json_hook = json_webhook or JsonWebhook(
            config.webhook_url, timeout=timeout, retries=retries, on_retry=counter("webhook")
        )
        channels.append(WebhookChannel(json_hook, ui))
    channels.extend(
        alertmanager_channels(
            config,
            timeout=timeout,
            retries=retries,
            counter=lambda name, outcome: metrics.alerts.labels(channel=name, outcome=outcome).inc,
            undelivered=undelivered.add,
        )
    )
    log.info(
        "alerts_configured",
        channels=["log", *(c.name for c in channels)],
        slack_transport=slack_transport,
        storm_threshold=config.alert_storm_threshold,
        timeout_seconds=timeout,
    )
    return Dispatcher(
        channels,
        ledger,
        metrics,
        ui_url=ui,
        storm_threshold=config.alert_storm_threshold,
        storm_window=storm_window,
        digest_delay=digest_delay,
        undelivered=undelivered,
    )

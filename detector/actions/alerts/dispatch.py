"""The ``Alerter``: logs every group at once, then delivers to the channels off the detection path.

What stays here is routing, lanes and digests: the channels (``channels/``, one module each, built by
``detector/app/wiring.py`` from their registry) are known only as ``channels.base.Channel``.

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
seconds and sent as one follow-up too, never one message per group. Outcomes of groups this process
never announced (a new leader finishing an earlier leader's stops, a restart) are counted the same way:
past ``storm_threshold`` within ``storm_window`` they are gathered and sent as one follow-up each
``digest_delay`` seconds.

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

import hashlib
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from detector import logs
from detector.actions.alerts.channels.base import Channel, Closing
from detector.actions.alerts.channels.log import LOGGER, log_event
from detector.actions.alerts.group_text import plain_text
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.parts import PartialDelivery
from detector.core.ports import AlertEvent, AlertKind, Ledger
from detector.errors import LedgerFault
from detector.metrics import Metrics

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


# --- claims -------------------------------------------------------------------------------------


def outcome_signature(event: AlertEvent) -> str:
    """Stable id of one outcome (which run ended how), so a replayed outcome is not announced twice."""
    parts = sorted(f"{r.action.run.run_id}={r.result.value}" for r in event.results)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def joined_signature(event: AlertEvent) -> str:
    """Stable id of the runs that joined an announced group, so that news is announced once."""
    return hashlib.sha256("\n".join(sorted(event.new_runs)).encode()).hexdigest()[:16]


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
        stopping: threading.Event | None = None,
    ) -> None:
        self.ledger, self.metrics, self.ui_url = ledger, metrics, ui_url
        self.storm_threshold, self.storm_window, self.digest_delay = storm_threshold, storm_window, digest_delay
        self._lanes = [_Lane(c) for c in channels]
        self._inbound: queue.Queue[Any] = queue.Queue()
        self._arrivals: deque[float] = deque()
        self._outcome_arrivals: deque[float] = deque()  # outcomes of groups no digest announced
        self._digest: list[AlertEvent] | None = None
        self._digest_deadline: float | None = None
        self._held: list[AlertEvent] = []
        # groups sent in a digest lately -> their outcomes are digested too (bounded: a storm's worth)
        self._digested: OrderedDict[str, None] = OrderedDict()
        self._late: list[AlertEvent] = []  # outcomes of digested groups, after their digest went out
        self._late_deadline: float | None = None
        self._undelivered_lately = undelivered or Undelivered()
        self._stopping = stopping or threading.Event()  # the channels' paces: nothing more goes out
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
            if isinstance(lane.channel, Closing):
                lane.channel.close(max(0.0, deadline - time.monotonic()))
        if not any(t is not None and t.is_alive() for t in [self._router, *(lane.thread for lane in self._lanes)]):
            return
        self._abandoned = True
        self._stopping.set()
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
            elif event.finding.key in self._digested or self._outcome_storm(now):
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

    def _outcome_storm(self, now: float) -> bool:
        """More than ``storm_threshold`` outcomes of undigested groups within ``storm_window``: a new
        leader picking up an earlier leader's pending stops (their DETECTED alerts went out before), or
        a restart. They are gathered like a digest's late outcomes, never one message each."""
        self._outcome_arrivals.append(now)
        while self._outcome_arrivals and self._outcome_arrivals[0] <= now - self.storm_window:
            self._outcome_arrivals.popleft()
        return len(self._outcome_arrivals) > self.storm_threshold

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
        except Exception as exc:  # noqa: BLE001 - without a ledger, alert anyway: a repeat beats silence
            if not isinstance(exc, LedgerFault):  # a broken ledger is one ledger_fault line, not one per alert
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
            if not isinstance(exc, LedgerFault):  # a broken ledger is one ledger_fault line, not one per alert
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

"""What an alert channel is (``Channel``, for the dispatcher) and what building one may use (``Needs``).

A channel module defines its channel class and ``build(config, needs)``: the channels it makes for
``config`` (none when it is not configured). ``channels/__init__.py`` registers the builders.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from detector.actions.alerts.notice import Notice
from detector.actions.alerts.pace import Pace
from detector.config import Config
from detector.core.ports import AlertEvent, Ledger
from detector.metrics import Metrics


class Channel(Protocol):
    """One destination. Each method delivers or raises (``AlertDeliveryError`` when the cause is known);
    the digest methods return how many messages or payloads they sent, and raise ``PartialDelivery``
    when some of them failed."""

    name: str

    @property
    def transport(self) -> str | None:
        """Which of a destination's transports this is, where it has several (Slack: bot or webhook)."""
        ...

    def detected(self, event: AlertEvent) -> None: ...

    def outcome(self, event: AlertEvent) -> None: ...

    def digest(self, events: Sequence[AlertEvent]) -> int: ...

    def digest_outcomes(self, events: Sequence[AlertEvent]) -> int: ...

    def notice(self, notice: Notice) -> None: ...


@runtime_checkable
class Closing(Protocol):
    """A channel with work of its own to stop at shutdown (Alertmanager's re-sends)."""

    def close(self, timeout: float) -> None: ...


@dataclass(frozen=True)
class Needs:
    """What a channel's ``build`` may use besides the config."""

    ledger: Ledger  # the Slack bot remembers its threads there
    metrics: Metrics
    timeout: float  # seconds, each attempt (``DUPGUARD_ALERT_TIMEOUT``)
    retries: int
    undelivered: Callable[[str, str], None]  # (channel, error): an alert a channel's own thread failed to send
    requests_per_minute: int = 0  # each channel's bound (``pace``); 0: none
    stopping: threading.Event = field(default_factory=threading.Event)  # set: the alerter gave up at shutdown

    def pace(self) -> Pace:
        """A channel's own bound on its requests per minute."""
        return Pace(self.requests_per_minute, stop=self.stopping)

    def counter(self, channel: str, outcome: str = "retried") -> Callable[[], None]:
        """Counts one ``dupguard_alerts_total{channel, outcome}``."""
        return self.metrics.alerts.labels(channel=channel, outcome=outcome).inc


Builder = Callable[[Config, Needs], Sequence[Channel]]

"""Every alert channel at once, each sending to a local server that speaks its API, and each sink's
requests counted: the Slack stand-in (``tests.slack_server``: the bot's Web API, an incoming webhook and
a generic JSON webhook) and a real Alertmanager behind a counting proxy (``tests.alertmanager``).

``Sinks.alerter`` builds the real dispatcher with the real channels for a daemon
(``tests.daemon_harness.start_daemon(alerter_factory=...)``); ``per_minute`` is the most requests a
sink received in any 60 s window. The Slack webhook channel is renamed ``slack_webhook``: the bot and
the incoming webhook are never configured together (the bot wins), and both would claim alerts as
``slack``.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Any

from detector.actions.alerts.channels import Needs, alertmanager, slack_bot, slack_webhook, webhook
from detector.actions.alerts.channels.base import Channel
from detector.actions.alerts.dispatch import Dispatcher, Undelivered
from detector.config import Config
from detector.core.ports import Ledger
from detector.metrics import Metrics
from tests.alertmanager import Alertmanager, ArrivalsProxy, Receiver, route_config
from tests.alertmanager import alertmanager as start_alertmanager
from tests.slack_server import SlackServer

SINKS = ("slack_bot", "slack_webhook", "webhook", "alertmanager")
CHANNEL = "#airflow-alerts"


def per_minute(times: list[float], since: float = float("-inf"), window: float = 60.0) -> int:
    """The most of ``times`` (seconds, any order) at or after ``since`` within any ``window`` seconds."""
    kept = sorted(t for t in times if t >= since)
    return max((bisect.bisect_right(kept, t + window - 1e-9) - i for i, t in enumerate(kept)), default=0)


class Sinks:
    """The local servers; ``with Sinks() as sinks:`` starts and stops them."""

    def __init__(self, *, digest_delay: float = 10.0, storm_window: float = 60.0) -> None:
        self.digest_delay, self.storm_window = digest_delay, storm_window
        self.slack = SlackServer()
        self.receiver = Receiver()
        self._am_context = start_alertmanager(route_config(self.receiver.url))
        self.am: Alertmanager = self._am_context.__enter__()
        self.proxy = ArrivalsProxy(self.am.url)
        self.dispatchers: list[Dispatcher] = []

    def __enter__(self) -> Sinks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self.proxy.stop()
        self._am_context.__exit__(None, None, None)
        self.receiver.stop()
        self.slack.stop()

    def settings(self) -> dict[str, Any]:
        """Every channel's settings for a daemon's config (the Slack webhook's is used by ``alerter``)."""
        return {
            "slack_bot_token": self.slack.token,
            "slack_channel": CHANNEL,
            "slack_api_url": self.slack.api_url,
            "slack_webhook_url": self.slack.webhook_url,
            "webhook_url": self.slack.generic_url,
            "alertmanager_urls": (self.proxy.url,),
            "cluster_name": "storm",
        }

    def alerter(self, config: Config, ledger: Ledger, metrics: Metrics) -> Dispatcher:
        """As ``detector.app.wiring.build_alerter`` builds it, with both Slack transports."""
        undelivered = Undelivered()
        needs = Needs(
            ledger,
            metrics,
            config.alert_timeout.total_seconds(),
            2,
            undelivered.add,
            requests_per_minute=config.alert_requests_per_minute,
        )
        hooked = slack_webhook.build(replace(config, slack_bot_token=None, slack_channel=None), needs)
        for channel in hooked:
            channel.name = "slack_webhook"
        made: list[Channel] = [
            *slack_bot.build(config, needs),
            *hooked,
            *webhook.build(config, needs),
            *alertmanager.build(config, needs),
        ]
        metrics.init_alerts([c.name for c in made])
        dispatcher = Dispatcher(
            made,
            ledger,
            metrics,
            ui_url=config.airflow_ui_url,
            storm_threshold=config.alert_storm_threshold,
            storm_window=self.storm_window,
            digest_delay=self.digest_delay,
            undelivered=undelivered,
            stopping=needs.stopping,
        )
        self.dispatchers.append(dispatcher)
        return dispatcher

    def times(self) -> dict[str, list[float]]:
        """Each sink's request arrival times (``time.monotonic()``)."""
        with self.slack._lock:
            paths = list(zip(self.slack.requests, self.slack.request_times, strict=True))
        found: dict[str, list[float]] = {sink: [] for sink in SINKS}
        for path, at in paths:
            if path.startswith("/api/"):
                found["slack_bot"].append(at)
            elif path == self.slack.webhook_path:
                found["slack_webhook"].append(at)
            elif path == self.slack.generic_path:
                found["webhook"].append(at)
        found["alertmanager"] = self.proxy.times()
        return found

    def rejected(self) -> list[tuple[str, str]]:
        return list(self.slack.rejected)

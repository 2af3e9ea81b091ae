"""The alert channels' registry: every channel module is registered, and ``build_alerter`` builds the
configured channels in the registry's order, Slack's bot replacing its incoming webhook, and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from structlog.testing import capture_logs

from detector.actions.alerts import channels
from detector.app.ledger import MemoryLedger
from detector.app.wiring import build_alerter
from detector.config import Config
from detector.metrics import Metrics

NOWHERE = "http://127.0.0.1:9"  # nothing is sent: building a channel connects to nothing


def _built(**settings: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """The alerter's channel names for these settings, and what building it logged."""
    with capture_logs() as logs:
        alerter = build_alerter(Config.of(**settings), MemoryLedger(), Metrics())
    alerter.close(1)
    return alerter.channel_names, [e for e in logs if e["event"] in ("alerts_configured", "alert_transport_ignored")]


def test_every_channel_module_is_registered_once() -> None:
    """A channel module missing from ``CHANNELS`` would never deliver; the log sink is written by the
    dispatcher itself and ``base`` is the interface."""
    modules = {p.stem for p in Path(channels.__file__).parent.glob("*.py")} - {"__init__", "base", "log"}
    registered = [build.__module__.rsplit(".", 1)[1] for build in channels.CHANNELS]
    assert sorted(registered) == sorted(modules)
    assert len(set(registered)) == len(registered)


def test_everything_configured_in_the_registry_order_the_bot_replacing_the_slack_webhook() -> None:
    names, logged = _built(
        slack_bot_token="xoxb-test",
        slack_channel="#alerts",
        slack_webhook_url=f"{NOWHERE}/slack",
        webhook_url=f"{NOWHERE}/generic",
        alertmanager_urls=(NOWHERE, "http://127.0.0.1:10"),
    )
    assert names == ["slack", "webhook", "alertmanager-1", "alertmanager-2"]
    ignored, configured = logged
    assert ignored["event"] == "alert_transport_ignored"
    assert (ignored["transport"], ignored["reason"]) == ("slack_webhook", "a bot token is configured")
    assert configured["channels"] == ["log", *names]
    assert configured["slack_transport"] == "bot"


def test_the_slack_webhook_without_a_bot() -> None:
    names, [configured] = _built(slack_webhook_url=f"{NOWHERE}/slack")
    assert names == ["slack"]
    assert (configured["channels"], configured["slack_transport"]) == (["log", "slack"], "webhook")


def test_nothing_configured_is_the_log_sink_alone() -> None:
    names, [configured] = _built(slack_bot_token="xoxb-test")  # a token without a channel is no bot
    assert names == []
    assert (configured["channels"], configured["slack_transport"]) == (["log"], None)
    assert (configured["storm_threshold"], configured["timeout_seconds"]) == (5, 5.0)

"""The alert channels, one module each (the channel, its transport and its format), registered here, once.

A channel module has a ``build(config, needs)`` that returns its channels for ``config`` (none when it
is not configured; Alertmanager one per URL). ``build`` returns them all, in the order of ``CHANNELS``
(the order ``alerts_configured`` names them); the wiring (``detector/app/wiring.py``) hands them to the
dispatcher, which never names one. The log sink (``channels/log.py``) is always on and written by the
dispatcher itself, so it is not registered.
"""

from __future__ import annotations

from detector.actions.alerts.channels import alertmanager, slack_bot, slack_webhook, webhook
from detector.actions.alerts.channels.base import Builder, Channel, Needs
from detector.config import Config

__all__ = ["CHANNELS", "Channel", "Needs", "build"]

CHANNELS: tuple[Builder, ...] = (
    slack_bot.build,
    slack_webhook.build,  # only without a bot: it says so when both are set
    webhook.build,
    alertmanager.build,
)


def build(config: Config, needs: Needs) -> list[Channel]:
    """The configured channels of every registered kind."""
    return [channel for make in CHANNELS for channel in make(config, needs)]

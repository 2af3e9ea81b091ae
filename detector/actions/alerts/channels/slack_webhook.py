"""The Slack incoming-webhook channel (``DUPGUARD_SLACK_WEBHOOK_URL``, when no bot is configured): one
message per group, follow-ups as new messages naming the group.

The transport (``SlackWebhook``) sends with slack-sdk's ``WebhookClient`` (``slack_clients``); what the
messages say is ``slack_messages``, shared with the bot channel.
"""

from __future__ import annotations

from collections.abc import Sequence

from slack_sdk.errors import SlackClientError
from slack_sdk.webhook import WebhookClient

from detector import logs
from detector.actions.alerts.channels.base import Needs
from detector.actions.alerts.channels.log import LOGGER
from detector.actions.alerts.channels.slack_bot import configured as bot_configured
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.oncall import NO_LINKS, Links
from detector.actions.alerts.pace import UNPACED, Pace
from detector.actions.alerts.slack_clients import failure, make_webhook_client
from detector.actions.alerts.slack_messages import (
    detected_message,
    digest_message,
    digest_outcome_message,
    outcome_message,
)
from detector.actions.alerts.text import Message
from detector.config import Config
from detector.core.ports import AlertEvent
from detector.errors import AlertDeliveryError


class SlackWebhook:
    """Sends messages to a Slack incoming webhook (no threads, no updates: follow-ups are new messages)."""

    def __init__(self, client: WebhookClient, pace: Pace = UNPACED) -> None:
        self.client, self.pace = client, pace

    def send(self, message: Message) -> None:
        self.pace.wait()
        try:
            resp = self.client.send(text=message.text, blocks=list(message.blocks), unfurl_links=False)
        except (SlackClientError, OSError) as exc:
            raise failure("slack webhook", exc) from None
        if resp.status_code != 200:
            raise AlertDeliveryError(f"slack webhook: HTTP {resp.status_code}, {str(resp.body)[:100]!r}")


class SlackWebhookChannel:
    """An incoming webhook: one message per group, follow-ups as new messages naming the group."""

    name = "slack"
    transport = "webhook"  # alerts_configured's slack_transport

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


def build(config: Config, needs: Needs) -> list[SlackWebhookChannel]:
    if not config.slack_webhook_url:
        return []
    if bot_configured(config):
        logs.get(LOGGER).warning(
            "alert_transport_ignored", transport="slack_webhook", reason="a bot token is configured"
        )
        return []
    hook = make_webhook_client(
        config.slack_webhook_url, timeout=needs.timeout, on_retry=needs.counter("slack"), retries=needs.retries
    )
    return [SlackWebhookChannel(SlackWebhook(hook, needs.pace()), config.airflow_ui_url, Links.of(config))]

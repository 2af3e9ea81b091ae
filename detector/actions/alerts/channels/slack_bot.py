"""The Slack bot channel (``DUPGUARD_SLACK_BOT_TOKEN`` and ``DUPGUARD_SLACK_CHANNEL``): a group's first
message in the channel, its outcomes threaded under it and the first message updated to show them.

The transport (``SlackBot``) posts and updates with slack-sdk's ``WebClient`` (``slack_clients``);
what the messages say is ``slack_messages``, shared with the incoming-webhook channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

from slack_sdk import WebClient
from slack_sdk.errors import SlackClientError

from detector import logs
from detector.actions.alerts.channels.base import Needs
from detector.actions.alerts.channels.log import LOGGER
from detector.actions.alerts.notice import Notice
from detector.actions.alerts.oncall import NO_LINKS, Links
from detector.actions.alerts.pace import UNPACED, Pace
from detector.actions.alerts.parts import send_each
from detector.actions.alerts.slack_clients import failure, make_web_client
from detector.actions.alerts.slack_messages import (
    detected_message,
    digest_message,
    digest_outcome_message,
    outcome_message,
)
from detector.actions.alerts.text import Message
from detector.config import Config
from detector.core.ports import AlertEvent, Ledger
from detector.errors import LedgerFault

SLACK_TS = "slack_ts"
SLACK_CHANNEL_ID = "slack_channel_id"
SLACK_DIGEST = "slack_digest"


@dataclass(frozen=True)
class Posted:
    channel_id: str  # chat.update needs the id Slack answers with, not the configured name
    ts: str


class SlackBot:
    """Posts, threads and updates messages in one channel with a bot token."""

    def __init__(self, client: WebClient, channel: str, pace: Pace = UNPACED) -> None:
        self.client = client
        self.channel = channel
        self.pace = pace

    def post(self, message: Message, thread_ts: str | None = None, channel: str | None = None) -> Posted:
        """Post ``message`` (as a reply when ``thread_ts`` is given) to ``channel`` or the configured one."""
        kwargs = message.as_kwargs() | {
            "channel": channel or self.channel,
            "unfurl_links": False,
            "unfurl_media": False,
        }
        if thread_ts:
            kwargs["thread_ts"] = thread_ts
        self.pace.wait()
        try:
            resp = self.client.chat_postMessage(**kwargs)
        except (SlackClientError, OSError) as exc:
            raise failure("chat.postMessage", exc) from None
        return Posted(channel_id=str(resp.get("channel") or self.channel), ts=str(resp["ts"]))

    def update(self, posted: Posted, message: Message) -> None:
        self.pace.wait()
        try:
            self.client.chat_update(channel=posted.channel_id, ts=posted.ts, **message.as_kwargs())
        except (SlackClientError, OSError) as exc:
            raise failure("chat.update", exc) from None


class SlackBotChannel:
    """First message in the channel; outcomes threaded under it, and the first message updated to show them.

    The message ts and channel id live in the ledger (``slack_ts``, ``slack_channel_id``), so a
    restarted or other replica still threads its follow-ups under the right message.
    """

    name = "slack"
    transport = "bot"  # alerts_configured's slack_transport (only Slack has two)

    def __init__(self, bot: SlackBot, ledger: Ledger, ui_url: str | None = None, links: Links = NO_LINKS) -> None:
        self.bot, self.ledger, self.ui_url, self.links = bot, ledger, ui_url, links

    def _remember(self, key: str, posted: Posted, digest: bool = False) -> None:
        try:
            self.ledger.remember(key, SLACK_TS, posted.ts)
            self.ledger.remember(key, SLACK_CHANNEL_ID, posted.channel_id)
            if digest:
                self.ledger.remember(key, SLACK_DIGEST, posted.ts)
        except LedgerFault:
            pass  # the broken ledger is reported once (a ledger_fault line); the follow-ups go unthreaded
        except Exception:  # noqa: BLE001 - the message is out; only its follow-ups lose their thread
            logs.get(LOGGER).exception("alert_thread_not_remembered", channel=self.name, group_key=key)

    def _thread(self, key: str) -> Posted | None:
        """The group's first message, if the ledger knows it (a broken one does not: posted unthreaded)."""
        try:
            ts = self.ledger.recall(key, SLACK_TS)
            if ts is None:
                return None
            return Posted(self.ledger.recall(key, SLACK_CHANNEL_ID) or self.bot.channel, ts)
        except LedgerFault:
            return None

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


def configured(config: Config) -> bool:
    """A bot token and a channel: the bot is Slack's transport (an incoming webhook is then ignored)."""
    return bool(config.slack_bot_token and config.slack_channel)


def build(config: Config, needs: Needs) -> list[SlackBotChannel]:
    token, channel = config.slack_bot_token, config.slack_channel
    if not (token and channel):
        return []
    client = make_web_client(
        token,
        api_url=config.slack_api_url,
        timeout=needs.timeout,
        on_retry=needs.counter("slack"),
        retries=needs.retries,
    )
    return [
        SlackBotChannel(SlackBot(client, channel, needs.pace()), needs.ledger, config.airflow_ui_url, Links.of(config))
    ]

"""The Slack stand-in refuses what Slack refuses (tests/slack_limits.py): each published Block Kit limit
broken by one character or item is answered ``invalid_blocks`` in Slack's shape, and the limit itself
is taken, so the alert tests that post through it cannot pass with a message Slack would reject."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from detector.actions.alerts.channels.slack_bot import SlackBot
from detector.actions.alerts.channels.slack_webhook import SlackWebhook
from detector.actions.alerts.slack_clients import make_web_client, make_webhook_client
from detector.actions.alerts.text import Message
from detector.errors import AlertDeliveryError
from tests.slack_server import SlackServer


def _section(text: str = "x", **extra: Any) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}, **extra}


def _context(n: int, text: str = "x") -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text}] * n}


def _fields(n: int, size: int = 1) -> dict[str, Any]:
    return {"type": "section", "fields": [{"type": "mrkdwn", "text": "f" * size}] * n}


def _button(text: str = "Open", url: str = "https://airflow.example/x") -> dict[str, Any]:
    return {
        "type": "actions",
        "elements": [{"type": "button", "text": {"type": "plain_text", "text": text}, "url": url}],
    }


def _header(text: str, kind: str = "plain_text") -> dict[str, Any]:
    return {"type": "header", "text": {"type": kind, "text": text}}


# limit -> (blocks at the limit, blocks one past it, the JSON pointer Slack names)
LIMITS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], str]] = {
    "50 blocks": ([_section()] * 50, [_section()] * 51, "/blocks"),
    "section text 3000": ([_section("s" * 3000)], [_section("s" * 3001)], "/blocks/0/text/text"),
    "header 150": ([_header("h" * 150)], [_header("h" * 151)], "/blocks/0/text/text"),
    "header plain_text": ([_header("h")], [_header("h", "mrkdwn")], "/blocks/0/text/type"),
    "context 10 elements": ([_context(10)], [_context(11)], "/blocks/0/elements"),
    "context text 3000": ([_context(1, "c" * 3000)], [_context(1, "c" * 3001)], "/blocks/0/elements/0/text"),
    "10 fields": ([_fields(10)], [_fields(11)], "/blocks/0/fields"),
    "field 2000": ([_fields(1, 2000)], [_fields(1, 2001)], "/blocks/0/fields/0/text"),
    "button text 75": ([_button("b" * 75)], [_button("b" * 76)], "/blocks/0/elements/0/text/text"),
    "button url 3000": (
        [_button(url="https://a.example/" + "u" * 2982)],
        [_button(url="https://a.example/" + "u" * 2983)],
        "/blocks/0/elements/0/url",
    ),
    "text type": (
        [_section()],
        [{"type": "section", "text": {"type": "markdown", "text": "x"}}],
        "/blocks/0/text/type",
    ),
    "emoji on mrkdwn": (
        [{"type": "section", "text": {"type": "plain_text", "text": "x", "emoji": True}}],
        [{"type": "section", "text": {"type": "mrkdwn", "text": "x", "emoji": True}}],
        "/blocks/0/text/emoji",
    ),
}


@pytest.fixture(scope="module")
def slack() -> Iterator[SlackServer]:
    server = SlackServer()
    yield server
    server.stop()


def _bot(slack: SlackServer) -> SlackBot:
    return SlackBot(make_web_client(slack.token, api_url=slack.api_url, timeout=5, on_retry=lambda: None), "#alerts")


@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_the_limit_is_taken_and_one_past_it_is_invalid_blocks(slack: SlackServer, limit: str) -> None:
    ok, over, pointer = LIMITS[limit]
    bot = _bot(slack)
    bot.post(Message(text="fallback", blocks=tuple(ok)))
    before = len(slack.rejected)
    with pytest.raises(AlertDeliveryError, match="error 'invalid_blocks'"):
        bot.post(Message(text="fallback", blocks=tuple(over)))
    assert len(slack.rejected) == before + 1 and f"[json-pointer:{pointer}]" in slack.rejected[-1][1]


def _raw_post(slack: SlackServer, payload: dict[str, Any]) -> Any:
    """chat.postMessage as plain HTTP: what the stand-in answers, with no client in between."""
    request = urllib.request.Request(  # noqa: S310 - the local stand-in's http URL
        slack.api_url + "/chat.postMessage",
        data=json.dumps({"channel": "#alerts"} | payload).encode(),
        headers={"Authorization": f"Bearer {slack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310
        assert answer.status == 200  # Slack's Web API answers errors with 200 and ok false
        return json.load(answer)


def test_the_answer_has_slacks_invalid_blocks_shape(slack: SlackServer) -> None:
    """``ok`` false, ``error`` invalid_blocks, each problem in ``errors`` and ``response_metadata.messages``."""
    problem = "must be less than 151 characters [json-pointer:/blocks/0/text/text]"
    assert _raw_post(slack, {"text": "t", "blocks": [_header("h" * 151)]}) == {
        "ok": False,
        "error": "invalid_blocks",
        "errors": [problem],
        "response_metadata": {"messages": [f"[ERROR] {problem}"]},
    }


def test_a_message_without_its_text_fallback_is_refused_on_both_transports(slack: SlackServer) -> None:
    assert _raw_post(slack, {"blocks": [_section()]})["error"] == "invalid_blocks"
    assert slack.rejected[-1][1].startswith("no text fallback")
    hook = SlackWebhook(make_webhook_client(slack.webhook_url, timeout=5, on_retry=lambda: None))
    with pytest.raises(AlertDeliveryError, match="HTTP 400"):
        hook.send(Message(text="", blocks=(_section(),)))
    assert slack.rejected[-1][1].startswith("no text fallback")

"""The slack-sdk clients of both Slack channels (``channels/slack_bot.py``: ``chat.postMessage`` /
``chat.update`` with a token; ``channels/slack_webhook.py``: the incoming webhook), their retries and
their errors.

Both channels' transports are thin wrappers around the clients built here and passed in, so tests point them at a
local Slack-compatible server (``DUPGUARD_SLACK_API_URL``). Retries are slack-sdk's own retry
handlers (https://tools.slack.dev/python-slack-sdk/web#retryhandler): 429 waits for ``Retry-After``,
any 5xx and connection errors or timeouts back off exponentially with jitter. A timeout is retried
although Slack may have posted the message: a rare double post beats a lost alert. Each attempt ends
within the timeout, from the connect to the answer's last byte (``detector.deadline``, installed for
``urllib.request.urlopen``, which slack-sdk calls), so a Slack that trickles cannot hold the lane.

Secrets: the token and the webhook URL are never put in an exception message or a log line. The
slack-sdk clients log through ``dupguard.alerts.slack_sdk``, which is kept at WARNING (slack-sdk
logs request URLs at DEBUG/INFO) and whose filter masks every secret registered here.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from http.client import RemoteDisconnected
from typing import Any
from urllib.error import URLError

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_handlers import (
    ConnectionErrorRetryHandler,
    RateLimitErrorRetryHandler,
    ServerErrorRetryHandler,
)
from slack_sdk.http_retry.handler import RetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.webhook import WebhookClient

from detector import deadline
from detector.errors import AlertDeliveryError

OnRetry = Callable[[], None]
_SECRETS: set[str] = set()


class _RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(s in message for s in _SECRETS):
            for secret in _SECRETS:
                message = message.replace(secret, "***")
            record.msg, record.args = message, None
        return True


sdk_logger = logging.getLogger("dupguard.alerts.slack_sdk")
sdk_logger.setLevel(logging.WARNING)
sdk_logger.addFilter(_RedactSecrets())


def register_secret(secret: str) -> None:
    """Mask ``secret`` in anything slack-sdk logs."""
    if secret:
        _SECRETS.add(secret)


class _Counted:
    """Calls ``on_retry`` each time a handler decides to retry (for ``dupguard_alerts_total{outcome="retried"}``)."""

    on_retry: OnRetry

    def prepare_for_next_attempt(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        self.on_retry()
        super().prepare_for_next_attempt(state=state, request=request, response=response, error=error)  # type: ignore[misc]


class _RateLimit(_Counted, RateLimitErrorRetryHandler):
    """slack-sdk's 429 handler: sleeps ``Retry-After`` (plus jitter) before the next attempt."""


class _ServerError(_Counted, ServerErrorRetryHandler):
    """slack-sdk's server-error handler, widened from 500/503 to every 5xx (502 and 504 come from proxies)."""

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is not None and 500 <= response.status_code <= 599


class _Connection(_Counted, ConnectionErrorRetryHandler):
    """slack-sdk's connection handler, also retrying timeouts (``TimeoutError``)."""


def retry_handlers(on_retry: OnRetry, retries: int = 2, rate_limit_retries: int = 3) -> list[RetryHandler]:
    """The retry policy of both transports: 429 honours Retry-After, 5xx/timeouts/resets back off."""
    handlers: list[RetryHandler] = []
    for cls, count in ((_RateLimit, rate_limit_retries), (_ServerError, retries)):
        h = cls(max_retry_count=count)
        h.on_retry = on_retry
        handlers.append(h)
    conn = _Connection(
        max_retry_count=retries, error_types=[URLError, ConnectionResetError, RemoteDisconnected, TimeoutError]
    )
    conn.on_retry = on_retry
    handlers.append(conn)
    return handlers


def _seconds(timeout: float) -> int:
    # slack-sdk types its timeout as int seconds (it hands it to urlopen); never round down to 0.
    return max(1, math.ceil(timeout))


def make_web_client(
    token: str, *, api_url: str | None, timeout: float, on_retry: OnRetry, retries: int = 2
) -> WebClient:
    """A WebClient for the bot transport. ``api_url`` includes the ``/api`` path (e.g. https://slack.com/api)."""
    register_secret(token)
    deadline.install("slack")
    kwargs: dict[str, Any] = {}
    if api_url:
        kwargs["base_url"] = api_url.rstrip("/") + "/"
    return WebClient(
        token=token,
        timeout=_seconds(timeout),
        logger=sdk_logger,
        retry_handlers=retry_handlers(on_retry, retries),
        **kwargs,
    )


def make_webhook_client(url: str, *, timeout: float, on_retry: OnRetry, retries: int = 2) -> WebhookClient:
    register_secret(url)
    deadline.install("slack")
    return WebhookClient(
        url, timeout=_seconds(timeout), logger=sdk_logger, retry_handlers=retry_handlers(on_retry, retries)
    )


def failure(what: str, exc: BaseException) -> AlertDeliveryError:
    """An error naming what failed and why, without the URL or token (never ``str(exc)`` of a client error)."""
    if isinstance(exc, SlackApiError):
        status = getattr(exc.response, "status_code", "?")
        error = exc.response.get("error") if isinstance(exc.response.data, dict) else None
        return AlertDeliveryError(f"{what}: HTTP {status}, error {str(error)[:100]!r}")
    if isinstance(exc, deadline.DeadlineExceeded):
        return AlertDeliveryError(f"{what}: {exc} (--alert-timeout)")
    if isinstance(exc, TimeoutError):
        return AlertDeliveryError(f"{what}: timed out")
    if isinstance(exc, URLError):
        return AlertDeliveryError(f"{what}: cannot connect ({type(exc.reason).__name__})")
    return AlertDeliveryError(f"{what}: {type(exc).__name__}")

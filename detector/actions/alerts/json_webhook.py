"""The JSON POST transport of the generic webhook channel (``DUPGUARD_WEBHOOK_URL``, for PagerDuty-,
Opsgenie- or Teams-style receivers) and of the Alertmanager channels.

The webhook channel (``channels/webhook.py``) POSTs the versioned ``dupguard.alert/v1`` payload
(documented in docs/how-to/alerts.md). Every attempt has a timeout; 429 waits for ``Retry-After`` (seconds or
an HTTP date, capped at ``MAX_RETRY_AFTER``), and so does every later payload until that time has
passed (a storm's next parts would only be refused too); 5xx, 408, timeouts and connection errors back
off exponentially with jitter; other 4xx are final (the receiver rejected the payload: retrying would
not help).

Every attempt also has a whole-request deadline (the same timeout, from the connect to the answer's
last byte: ``detector.deadline``), so a receiver that trickles cannot hold the channel.

Built on the standard library's ``urllib.request`` on purpose: it logs nothing, so the URL (which
often embeds a routing key) can never reach a log, and it needs no dependency dupguard does not
already declare. Errors name the status or the exception class, never the URL.
"""

from __future__ import annotations

import json
import random
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from http.client import HTTPException
from typing import Any
from urllib.error import HTTPError, URLError

from detector import __version__, deadline
from detector.actions.alerts.pace import UNPACED, Pace
from detector.durations import retry_after
from detector.errors import AlertDeliveryError

OnRetry = Callable[[], None]
MAX_RETRY_AFTER = 60.0


def _retry_after(value: str | None, default: float) -> float:
    asked = retry_after(value, time.time())
    return default if asked is None else min(MAX_RETRY_AFTER, asked)


class JsonWebhook:
    """POSTs JSON payloads to one URL with timeouts and retries.

    ``name`` opens its error messages (the Alertmanager sink names each of its URLs); ``headers`` are
    sent with every request (credentials: never logged, never in an error); ``context``: the TLS
    settings (a CA bundle, or no verification)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float,
        retries: int = 2,
        backoff: float = 0.5,
        on_retry: OnRetry | None = None,
        sleep: Callable[[float], None] = time.sleep,
        name: str = "webhook",
        headers: Mapping[str, str] | None = None,
        context: ssl.SSLContext | None = None,
        pace: Pace = UNPACED,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"the {name} URL must be http:// or https://")
        self._url = url
        self.name = name
        self._headers = dict(headers or {})
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.on_retry = on_retry or (lambda: None)
        self.sleep = sleep
        self.pace = pace  # every attempt waits its turn (a storm's parts)
        self._quiet_until = 0.0  # time.monotonic() before which the receiver asked not to be called
        self._opener = deadline.opener(name, context)

    def __repr__(self) -> str:
        return "JsonWebhook(url=***)"

    def send(self, payload: Any) -> None:
        """Deliver ``payload`` or raise ``AlertDeliveryError`` after the last attempt."""
        body = json.dumps(payload, default=str).encode()
        problem = "not attempted"
        for attempt in range(self.retries + 1):
            wait = self.backoff * (2**attempt) * (0.5 + random.random() / 2)  # jitter, not crypto
            quiet = self._quiet_until - time.monotonic()
            if quiet > 0:
                self.sleep(quiet)
            self.pace.wait()
            try:
                self._post(body)
                return
            except HTTPError as exc:
                problem = f"HTTP {exc.code}"
                if exc.code == 429:
                    wait = _retry_after(exc.headers.get("Retry-After"), wait)
                    self._quiet_until = time.monotonic() + wait
                elif exc.code < 500 and exc.code != 408:
                    raise AlertDeliveryError(f"{self.name} rejected the alert: {problem}") from None
            except deadline.DeadlineExceeded as exc:
                problem = str(exc)
            except TimeoutError:
                problem = "timed out"
            except (URLError, HTTPException, OSError) as exc:
                problem = f"cannot connect ({type(getattr(exc, 'reason', exc)).__name__})"
            if attempt < self.retries:
                self.on_retry()
                self.sleep(wait)
        raise AlertDeliveryError(f"{self.name}: {problem} after {self.retries + 1} attempts")

    def _post(self, body: bytes) -> None:
        request = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
            self._url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "User-Agent": f"dupguard/{__version__}"} | self._headers,
        )
        with self._opener.open(request, timeout=self.timeout) as resp:
            resp.read()

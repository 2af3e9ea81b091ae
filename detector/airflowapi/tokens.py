"""The bearer token for Airflow's REST API (facts §4.3/4.4).

A static token, or one from ``POST {api}/auth/token`` with username/password. The client has no
token call, so the request goes through the client's own HTTP pool (same TLS settings and timeout).
The token's ``exp`` is read (not verified) to refresh it before it expires; a 401 invalidates it.
Wrong credentials raise ``AirflowAuthError`` at once: at most one token request per action, then a
growing back-off during which later calls fail without asking again (no account lock-out, no
retry storm).
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from airflow_client.client import ApiClient
from airflow_client.client.exceptions import ApiException

from detector import redact
from detector.airflowapi.client import Transient, api_exception, detail, json_body, transport
from detector.errors import AirflowApiError, AirflowAuthError


@dataclass
class Budget:
    """Per action: how many token requests it may still send (wrong credentials: exactly one)."""

    token_requests: int = 1


def jwt_claims(token: str) -> dict[str, Any]:
    """The JWT's payload, decoded without verifying it (only to learn ``exp``); {} if unreadable."""
    try:
        payload = token.split(".")[1]
        data = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class TokenSource:
    """A JWT for the API: static, or from ``POST /auth/token``, cached until shortly before ``exp``."""

    def __init__(
        self,
        client: ApiClient,
        base_url: str,
        *,
        username: str | None,
        password: str | None,
        static_token: str | None,
        timeout: float,
        auth_backoff: float = 60.0,
        max_auth_backoff: float = 900.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/auth/token"
        self._shown = redact.web_url(self._url)  # for messages: no userinfo password
        self._username = username
        self._password = password
        self._static = static_token
        self._timeout = timeout
        self._backoff = auth_backoff
        self._max_backoff = max_auth_backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = static_token
        self._refresh_at = float("inf")
        self._blocked_until = 0.0
        self._failures = 0
        self.requests_sent = 0  # POST /auth/token calls that reached the server (metrics/tests)

    @property
    def static(self) -> bool:
        return self._static is not None

    def secrets(self) -> tuple[str | None, ...]:
        """What an error text must never contain (an API may echo the request or the token)."""
        return (self._password, self._static, self._token)

    def get(self, budget: Budget) -> str:
        with self._lock:
            if self._token is not None and (self.static or self._clock() < self._refresh_at):
                return self._token
            return self._fetch(budget)

    def invalidate(self) -> None:
        with self._lock:
            if not self.static:
                self._token = None

    def _fetch(self, budget: Budget) -> str:
        now = self._clock()
        if now < self._blocked_until:
            raise AirflowAuthError(
                f"Airflow rejected user {self._username!r} at {self._shown} earlier; not asking again "
                f"for {self._blocked_until - now:.0f} s (check DUPGUARD_AIRFLOW_USERNAME / DUPGUARD_AIRFLOW_PASSWORD)"
            )
        if budget.token_requests <= 0:
            raise AirflowAuthError(
                f"a token just issued by {self._shown} was rejected: check that every api-server shares "
                "[api_auth] jwt_secret, jwt_issuer and jwt_audience"
            )
        try:
            response = self._client.rest_client.request(  # type: ignore[no-untyped-call]
                "POST",
                self._url,
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                body={"username": self._username, "password": self._password},
                _request_timeout=self._timeout,
            )
            response.read()
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"POST {self._shown}: {transport(exc)}") from None
        except ApiException as exc:
            raise AirflowApiError(f"POST {self._shown}: {api_exception(exc)}") from None
        self.requests_sent += 1
        status = response.status
        if status >= 500:  # the server failed, not the credentials: no budget spent, retried by the caller
            raise Transient(f"POST {self._shown}: HTTP {status} {detail(response.data, self.secrets())}".rstrip())
        budget.token_requests -= 1
        if status in (400, 401, 403, 422):
            self._failures += 1
            delay = min(self._max_backoff, self._backoff * 2 ** (self._failures - 1))
            self._blocked_until = self._clock() + delay
            shown = detail(response.data, self.secrets())
            raise AirflowAuthError(
                f"Airflow rejected user {self._username!r} at {self._shown} (HTTP {status} "
                f"{shown}): check DUPGUARD_AIRFLOW_USERNAME / DUPGUARD_AIRFLOW_PASSWORD; "
                f"next attempt in {delay:.0f} s"
            )
        token = json_body(response.data).get("access_token") if 200 <= status < 300 else None
        if not isinstance(token, str) or not token:
            raise AirflowApiError(f"POST {self._shown}: HTTP {status} without an access_token")
        self._failures = 0
        self._blocked_until = 0.0
        self._token = token
        claims = jwt_claims(token)
        exp, iat = claims.get("exp"), claims.get("iat", now)
        if isinstance(exp, int | float):
            lifetime = max(0.0, float(exp) - float(iat))
            self._refresh_at = float(exp) - min(60.0, 0.2 * lifetime)
        else:
            self._refresh_at = float("inf")  # no exp: keep it until a 401
        return token

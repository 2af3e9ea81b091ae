"""One authenticated call to Airflow's REST API: timeout, token, and the answer classified.

- 2xx: the body as a JSON object.
- 401 (or 403 "Invalid JWT token", e.g. after ``jwt_secret`` was rotated): the token is dropped and
  the call sent once more with a new one; a static token cannot be renewed -> ``AirflowAuthError``.
- 403: ``AirflowAuthError`` naming the permission the Airflow user lacks (the caller says which:
  ``detector.airflowapi.permissions``; Airflow's own answer is a bare "Forbidden").
- 404: ``Gone``. 429, 5xx and transport errors: ``Transient``, with the server's ``Retry-After``
  when it sent one (the caller decides whether and when to retry). A call with no complete answer
  within its deadline (``--airflow-timeout`` from the connect to the last byte, or the shorter
  ``deadline`` its caller gives) is cut and ``Transient`` too (``detector.deadline``).
- other: ``AirflowApiError``.

Every text is built from the status and the body's ``detail`` with secrets withheld
(``client.detail``); never from the request, which holds the Authorization header.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlencode

import urllib3
from airflow_client.client import ApiClient
from airflow_client.client.exceptions import ApiException

from detector import deadline as deadlines
from detector import redact
from detector.airflowapi.client import (
    Gone,
    Transient,
    api_exception,
    detail,
    json_body,
    make_client,
    not_json,
    refused,
    transport,
)
from detector.airflowapi.tokens import Budget, TokenSource
from detector.config import Config
from detector.durations import retry_after
from detector.errors import AirflowApiError, AirflowAuthError

Headers = dict[str, str]

# What the remediation's calls need (PATCH dagRun, bulk PATCH taskInstances).
EDIT_RUNS = (
    "a role that may edit DAG runs and task instances (FAB: User, Op or Admin; simple auth manager: user or higher)"
)


class Session:
    """The client, its token source and the call timeout: everything needed to call the API."""

    def __init__(self, client: ApiClient, tokens: TokenSource, *, base_url: str, timeout: float) -> None:
        self.client = client
        self.tokens = tokens
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # The API server's clock minus this host's, in seconds, from the last answer's Date header: the
        # REST source measures ages of Airflow's timestamps on the server's clock, not on a host clock
        # that may be off. None until an answer carried a Date.
        self.clock_offset: float | None = None

    @classmethod
    def from_config(
        cls, config: Config, *, auth_backoff: float = 60.0, clock: Callable[[], float] = time.time
    ) -> Session:
        if not config.airflow_api_url:
            raise AirflowApiError("the Airflow REST API needs DUPGUARD_AIRFLOW_API_URL")
        client = make_client(config)
        timeout = config.airflow_timeout.total_seconds()
        tokens = TokenSource(
            client,
            config.airflow_api_url,
            username=config.airflow_username,
            password=config.airflow_password,
            static_token=config.airflow_token,
            timeout=timeout,
            command=config.airflow_token_command,
            command_timeout=config.airflow_token_command_timeout.total_seconds(),
            auth_backoff=auth_backoff,
            clock=clock,
        )
        return cls(client, tokens, base_url=config.airflow_api_url, timeout=timeout)

    @property
    def shown_url(self) -> str:
        """The base URL for messages (no userinfo password)."""
        return redact.web_url(self.base_url)

    def close(self) -> None:
        self.client.rest_client.pool_manager.clear()

    def call(
        self,
        what: str,
        send: Callable[[Headers], Any],
        budget: Budget | None = None,
        *,
        needs: str,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """``send(headers)`` (a ``*_without_preload_content`` client method, or ``request``'s) with
        a bearer token; ``what`` names the call in messages, ``needs`` the permission a 403 lacks
        (``detector.airflowapi.permissions``). Each request ends within ``deadline`` seconds (at most
        the session's timeout) or raises ``Transient``."""
        budget = budget if budget is not None else Budget()
        seconds = self.timeout if deadline is None else min(deadline, self.timeout)
        for _ in range(2):  # the second pass only after a 401 with a cached token
            status, data, wait = self._send(what, send, self.tokens.get(budget), seconds)
            # 401 "Token Expired"; 403 "Invalid JWT token" (e.g. jwt_secret rotated): a new token may do.
            if status == 401 or (status == 403 and "invalid jwt" in detail(data, self.tokens.secrets()).lower()):
                self.tokens.invalidate()
                if self.tokens.static:
                    raise AirflowAuthError(
                        f"{what}: HTTP 401, the static DUPGUARD_AIRFLOW_TOKEN was rejected (expired?)"
                    )
                continue  # tokens.get() fetches a new one, or raises when this action already did
            if status == 403:
                shown = detail(data, self.tokens.secrets())
                raise AirflowAuthError(f"{what}: HTTP 403 {shown}: the Airflow user needs {needs}")
            if status == 404:
                raise Gone(f"{what}: {detail(data, self.tokens.secrets())}")
            if status == 409:
                raise Transient(f"{what}: HTTP 409 {detail(data, self.tokens.secrets())}", conflict=True)
            if status >= 500 or status == 429:
                raise Transient(f"{what}: HTTP {status} {detail(data, self.tokens.secrets())}", wait)
            if not 200 <= status < 300:
                raise AirflowApiError(f"{what}: HTTP {status} {detail(data, self.tokens.secrets())}")
            return json_body(data)
        raise AirflowAuthError(f"{what}: a freshly issued token was rejected too")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        budget: Budget | None = None,
        needs: str,
        deadline: float | None = None,
    ) -> dict[str, Any]:
        """A raw JSON call: ``path`` below the base URL (e.g. ``/api/v2/assets/events``), ``query``
        (lists repeat the key), ``body`` sent as JSON. Same classification and deadline as ``call``."""
        url = self.base_url + path + ("?" + urlencode(query, doseq=True) if query else "")
        what = f"{method} {path}"

        def send(headers: Headers) -> Any:
            headers = {**headers, "Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            response = self.client.rest_client.request(  # type: ignore[no-untyped-call]
                method, url, headers=headers, body=body, _request_timeout=self.timeout
            )
            response.read()  # RESTResponse holds the body in .data only once read
            unreadable = not_json(what, response)
            if unreadable is not None:  # read as {}, a list page would be "no runs" and a poll see nothing
                raise AirflowApiError(unreadable)
            return response

        return self.call(what, send, budget, needs=needs, deadline=deadline)

    def _send(
        self, what: str, send: Callable[[Headers], Any], token: str, seconds: float
    ) -> tuple[int, bytes, float | None]:
        try:
            with deadlines.limit(seconds, "airflow_api"):
                response = send({"Authorization": f"Bearer {token}"})
                data = response.data  # reads the body (and releases the connection to the pool)
            wait = retry_after(response.headers.get("Retry-After"), time.time())
            self._note_clock(response.headers.get("Date"))
            return int(response.status), bytes(data or b""), wait
        except deadlines.DeadlineExceeded as exc:
            raise Transient(f"{what}: {exc} (--airflow-timeout)") from None
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"{what}: {transport(exc)}", refused=refused(exc)) from None
        except ApiException as exc:
            raise AirflowApiError(f"{what}: {api_exception(exc)}") from None

    def _note_clock(self, date: str | None) -> None:
        if not date:
            return
        with contextlib.suppress(TypeError, ValueError, IndexError):
            self.clock_offset = parsedate_to_datetime(date).timestamp() - time.time()

"""The bearer token for Airflow's REST API.

What Airflow accepts, and how its Python client sends it: docs/explanation/airflow-internals.md, "Authentication"
and "The Python client".

Three ways to get one:
- static (``DUPGUARD_AIRFLOW_TOKEN``, e.g. an Astronomer Deployment API token): sent as is, never
  renewed; a 401 is an error naming it.
- ``POST {api}/auth/token`` with username/password (simple and FAB auth managers). The client has
  no token call, so the request goes through the client's own HTTP pool (same TLS settings and
  timeout).
- a command (``DUPGUARD_AIRFLOW_TOKEN_COMMAND``, run by ``/bin/sh -c``): its stdout is the token,
  for platforms that mint short-lived tokens (``gcloud auth print-access-token``, a script around
  ``aws mwaa create-web-login-token``, a mounted file that a sidecar rotates: ``cat /path``). It
  runs with a timeout in its own process group (killed whole when it overruns); its stdout is never
  logged; its exit code and the last line of its stderr are, unless that line looks secret.

A minted token's ``exp`` is read (not verified) to renew it before it expires; without ``exp`` (an
opaque token) it is kept until a 401. A 401 invalidates it. Failures raise ``AirflowAuthError`` at
once, at most one token request per action, then a growing back-off during which later calls fail
without asking again (no account lock-out, no login or command storm).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from airflow_client.client import ApiClient
from airflow_client.client.exceptions import ApiException

from detector import deadline, redact
from detector.airflowapi.client import Transient, api_exception, detail, json_body, not_json, refused, transport
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
        command: str | None = None,
        command_timeout: float = 30.0,
        auth_backoff: float = 60.0,
        max_auth_backoff: float = 900.0,
        command_backoff: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/auth/token"
        self._shown = redact.web_url(self._url)  # for messages: no userinfo password
        self._username = username
        self._password = password
        self._static = static_token
        self._timeout = timeout
        self._command = command
        self._command_timeout = command_timeout
        # a failing command is cheap to ask again (no account to lock): a shorter back-off
        self._backoff = command_backoff if command else auth_backoff
        self._max_backoff = max_auth_backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = static_token
        self._refresh_at = float("inf")
        self._blocked_until = 0.0
        self._failures = 0
        self.requests_sent = 0  # POST /auth/token calls that reached the server (metrics/tests)
        self.commands_run = 0  # runs of the token command (tests)
        self._last_failure = ""  # why the command failed last (repeated while backing off)

    @property
    def static(self) -> bool:
        return self._static is not None

    def secrets(self) -> tuple[str | None, ...]:
        """What an error text must never contain (an API may echo the request or the token)."""
        return (self._password, self._static, self._token, self._command)

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
        if self._command is not None:
            return self._run_command(budget, now)
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
            with deadline.limit(self._timeout, "airflow_token"):  # connect to last byte (detector.deadline)
                response = self._client.rest_client.request(  # type: ignore[no-untyped-call]
                    "POST",
                    self._url,
                    headers={"Content-Type": "application/json", "Accept": "application/json"},
                    body={"username": self._username, "password": self._password},
                    _request_timeout=self._timeout,
                )
                response.read()
        except deadline.DeadlineExceeded as exc:
            raise Transient(f"POST {self._shown}: {exc} (--airflow-timeout)") from None
        except urllib3.exceptions.HTTPError as exc:
            raise Transient(f"POST {self._shown}: {transport(exc)}", refused=refused(exc)) from None
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
        unreadable = not_json(f"POST {self._shown}", response)
        if unreadable is not None:  # a proxy's sign-in page is not "without an access_token"
            raise AirflowApiError(unreadable)
        token = json_body(response.data).get("access_token") if 200 <= status < 300 else None
        if not isinstance(token, str) or not token:
            raise AirflowApiError(f"POST {self._shown}: HTTP {status} without an access_token")
        return self._accept(token, now)

    def _accept(self, token: str, now: float) -> str:
        self._failures = 0
        self._blocked_until = 0.0
        self._token = token
        claims = jwt_claims(token)
        exp, iat = claims.get("exp"), claims.get("iat", now)
        if isinstance(exp, int | float):
            lifetime = max(0.0, float(exp) - float(iat))
            # A token that is (nearly) expired already is used all the same rather than minted
            # again at every call; the server's 401 then asks for the next one.
            self._refresh_at = max(float(exp) - min(60.0, 0.2 * lifetime), now + 1.0)
        else:
            self._refresh_at = float("inf")  # no exp (an opaque token): keep it until a 401
        return token

    def _run_command(self, budget: Budget, now: float) -> str:
        """The command's stdout as the token; any failure is one line that never quotes stdout."""
        name = "DUPGUARD_AIRFLOW_TOKEN_COMMAND"
        if now < self._blocked_until:
            raise AirflowAuthError(
                f"{name} failed earlier ({self._last_failure}); next attempt in {self._blocked_until - now:.0f} s"
            )
        if budget.token_requests <= 0:
            # This call already ran the command and the server refused what it printed: asking again
            # at once would only repeat that, so it backs off like any other failure of the command.
            raise self._command_failed(
                f"the token it just printed was rejected by {self._shown.removesuffix('/auth/token')}: "
                "is it a token for this Airflow deployment?"
            )
        budget.token_requests -= 1
        self.commands_run += 1
        assert self._command is not None
        proc = subprocess.Popen(
            ["/bin/sh", "-c", self._command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills the whole pipeline
        )
        try:
            out, err = proc.communicate(timeout=self._command_timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise self._command_failed(f"timed out after {self._command_timeout:g} s") from None
        token = out.decode("utf-8", "replace").strip()
        if proc.returncode != 0:
            lines = [line.strip() for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
            last = _stderr_line(lines[-1], (*self.secrets(), token)) if lines else ""
            raise self._command_failed(f"exit code {proc.returncode}" + (f": {last}" if last else ""))
        if not token:
            raise self._command_failed("printed nothing on stdout")
        if len(token.split()) != 1:
            raise self._command_failed("printed more than the token on stdout (expected one word)")
        return self._accept(token, now)

    def _command_failed(self, why: str) -> AirflowAuthError:
        self._last_failure = why
        self._failures += 1
        delay = min(self._max_backoff, self._backoff * 2 ** (self._failures - 1))
        self._blocked_until = self._clock() + delay
        return AirflowAuthError(f"DUPGUARD_AIRFLOW_TOKEN_COMMAND failed ({why}); next attempt in {delay:.0f} s")


def _stderr_line(line: str, known: tuple[str | None, ...]) -> str:
    """The command's last stderr line, or why it is not shown: the command is the user's own code and
    may print a secret dupguard never saw (``password=…``), so a line that holds a known secret or
    looks like one is withheld whole (patching it could leave part of the secret) and capped."""
    if redact.contains_secret(line, known) or redact.looks_secret(line):
        return "stderr withheld: it may hold a secret; run the command by hand to read it"
    return redact.cap(line, 200)

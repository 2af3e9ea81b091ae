"""The HTTP client for Airflow's REST API, and safe text for what it answers.

Responses are read as JSON, not through the client's models, so a client newer than the server
(e.g. client 3.3 against server 3.1) cannot fail on a field the server does not send.
Never in any text made here: tokens, passwords, Authorization headers.
"""

from __future__ import annotations

import json
from typing import Any

import urllib3
from airflow_client.client import ApiClient, Configuration
from airflow_client.client.exceptions import ApiException

from detector import deadline, redact
from detector.config import Config


class Transient(Exception):
    """A 5xx or 429 answer, or a transport error: worth another attempt.

    ``retry_after``: the seconds the server asked to wait (429/503 ``Retry-After``), else None.
    ``refused``: nothing reached the server (connection refused or unreachable), so retrying soon
    costs it nothing; a timeout or a 5xx may be an overloaded server and is not ``refused``."""

    def __init__(
        self, message: str, retry_after: float | None = None, *, refused: bool = False, conflict: bool = False
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.refused = refused
        # 409: another writer changed the object at the same moment (two replicas writing the same run
        # note: "Unique constraint violation"); our write did not apply, a re-check tells the state
        self.conflict = conflict


def refused(exc: urllib3.exceptions.HTTPError) -> bool:
    """The connection was never made (refused, no route, DNS): the request did not reach Airflow."""
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return isinstance(exc.reason, urllib3.exceptions.NewConnectionError)
    return isinstance(exc, urllib3.exceptions.NewConnectionError)


class Gone(Exception):
    """404: the object (a run, a task instance, …) does not exist (any more)."""


def make_client(config: Config) -> ApiClient:
    """An ApiClient with TLS verification on (optionally against a CA bundle) and no hidden retries.

    urllib3's default retries would repeat a PATCH on connection errors without the remediation
    guard's re-check in between; callers retry themselves.
    """
    assert config.airflow_api_url is not None
    cfg = Configuration(host=config.airflow_api_url)
    cfg.verify_ssl = config.airflow_verify_tls
    if config.airflow_ca_bundle:
        cfg.ssl_ca_cert = config.airflow_ca_bundle
    cfg.retries = False
    client = ApiClient(cfg)
    deadline.bind_urllib3(client.rest_client.pool_manager)  # a whole-request deadline: ``Session.call``
    return client


def json_body(data: bytes | None) -> dict[str, Any]:
    """The body as a JSON object; {} when it is not one."""
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def not_json(what: str, response: Any) -> str | None:
    """Why a 2xx answer to a raw JSON call cannot be used (a proxy's sign-in page, a cut body), else None:
    its status, content type and size (the body itself may be anything, a secret's echo too)."""
    if not 200 <= response.status < 300 or response.status == 204:
        return None
    data = bytes(response.data or b"")
    try:
        if isinstance(json.loads(data), dict):
            return None
    except ValueError:
        pass
    content_type = response.headers.get("Content-Type") or "none"
    return f"{what}: HTTP {response.status} answer is not JSON (Content-Type {content_type}, {len(data)} bytes)"


def detail(data: bytes | None, secrets: tuple[str | None, ...] = ()) -> str:
    """The ``detail`` of an error body, safe to log: secret-named fields (and the ``input`` a
    validation error echoes for them) masked by parsing; free text holding a secret withheld whole
    (Airflow's /auth/token answers a malformed login with ``repr(ValidationError)``, which quotes
    ``input_value={...'password': ...}``)."""
    found = redact.mask_fields(json_body(data).get("detail"))
    if found is None:
        return ""
    text = found if isinstance(found, str) else json.dumps(found)
    return redact.withhold(text, secrets)[:300]


def transport(exc: urllib3.exceptions.HTTPError) -> str:
    """A transport failure in a few words (never the request, which holds the Authorization header)."""
    if refused(exc):
        return "connection refused or unreachable (is the API server up?)"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return "timed out"
    return type(exc).__name__


def api_exception(exc: ApiException) -> str:
    """What the client raised (TLS failures among them) in one line."""
    reason = (exc.reason or "").splitlines()
    if reason and reason[0] == "SSLError":
        return (
            "TLS error: "
            + (reason[1] if len(reason) > 1 else "certificate verification failed")
            + (" (set DUPGUARD_AIRFLOW_CA_BUNDLE to the CA that signed the API's certificate)")
        )
    return (reason[0] if reason else type(exc).__name__)[:300]

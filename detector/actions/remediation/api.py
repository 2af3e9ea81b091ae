"""Backend ``api``: the remediation through Airflow 3's REST API with ``apache-airflow-client``.

- ``fail``: ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}`` ``{"state": "failed", "note": …}``;
  Airflow's ``set_dag_run_state_to_failed`` then marks the TIs (facts §4.2) and fires its listeners.
- ``skip``: the unfinished TIs -> skipped through the bulk TI endpoint (one call), then the note
  alone (``update_mask=["note"]``). Refused at start-up on Airflow 3.0/3.1 (``ConfigError``): their
  scheduler can put skipped tasks back (``DagRun.schedule_tis`` updates by id without a state check,
  dagrun.py L2046 in 3.1.2; 3.2 added the check), and the TI endpoint does not lock the ``dag_run``
  row the scheduler holds, so no read-back right after the write can prove the skip will last.

After the write the run's task instances are read again from the metadata DB and judged by
``detector.actions.remediation.readback``: a task that started in the window between the guard's re-read
and Airflow's write makes the result ``caught_after_start`` (naming it), a write that did not hold
``failed``.

Auth (facts §4.3/4.4): the client has no token call, so ``POST {api}/auth/token`` goes through the
client's own HTTP pool (same TLS settings and timeout); or a static token. The token's ``exp`` is
read (not verified) to refresh it before it expires; a 401 invalidates it and is retried once.
Wrong credentials raise ``AirflowAuthError`` at once: at most one token request per action, then a
growing back-off during which later actions fail without asking again (no account lock-out, no
retry storm).

Every call has a timeout. 5xx answers and transport errors (timeouts, refused connections) are
retried with exponential back-off, and the guard re-reads the run between attempts, so a retry never
acts on a run whose tasks started meanwhile. 404 means the run was deleted: GONE, not retried.
Responses are read as JSON, not through the client's models, so a client newer than the server
(e.g. client 3.3 against server 3.1) cannot fail on a field the server does not send.

Never logged: tokens, passwords, Authorization headers.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import urllib3
from airflow_client.client import (
    ApiClient,
    BulkBodyBulkTaskInstanceBody,
    Configuration,
    DagRunApi,
    DagRunMutableStates,
    DAGRunPatchBody,
    TaskInstanceApi,
)
from airflow_client.client.exceptions import ApiException
from sqlalchemy import Engine

from detector import logs, redact
from detector.actions.remediation.guarded import Applied, Recheck, Work, now_utc
from detector.actions.remediation.readback import read_back
from detector.config import Config
from detector.core.plan import Action, Mode
from detector.core.ports import Result
from detector.errors import AirflowApiError, AirflowAuthError, ConfigError, DupguardError
from detector.metadb import queries
from detector.metadb.engine import connect
from detector.metadb.schema import AirflowTables, Family

log = logs.get("dupguard.remediation.api")

# Airflow versions whose scheduler can undo a skip made through the API: DagRun.schedule_tis sets
# SCHEDULED by TI id without re-checking the state (dagrun.py L2046 in 3.1.2, L1990 in 3.0.6);
# 3.2.2 added ``schedulable_state_clause`` to that UPDATE.
_SKIP_UNDONE = frozenset({Family.AIRFLOW_3_0, Family.AIRFLOW_3_1})

Headers = dict[str, str]


class _Transient(Exception):
    """A 5xx answer or a transport error: worth another attempt while the run has not started."""


class _Gone(Exception):
    """404: the run (or one of its TIs) no longer exists."""


@dataclass
class _Budget:
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

    def get(self, budget: _Budget) -> str:
        with self._lock:
            if self._token is not None and (self.static or self._clock() < self._refresh_at):
                return self._token
            return self._fetch(budget)

    def invalidate(self) -> None:
        with self._lock:
            if not self.static:
                self._token = None

    def _fetch(self, budget: _Budget) -> str:
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
            raise _Transient(f"POST {self._shown}: {_transport(exc)}") from None
        except ApiException as exc:
            raise AirflowApiError(f"POST {self._shown}: {_api_exception(exc)}") from None
        self.requests_sent += 1
        status = response.status
        if status >= 500:  # the server failed, not the credentials: no budget spent, retried by the caller
            raise _Transient(f"POST {self._shown}: HTTP {status} {_detail(response.data, self.secrets())}".rstrip())
        budget.token_requests -= 1
        if status in (400, 401, 403, 422):
            self._failures += 1
            delay = min(self._max_backoff, self._backoff * 2 ** (self._failures - 1))
            self._blocked_until = self._clock() + delay
            detail = _detail(response.data, self.secrets())
            raise AirflowAuthError(
                f"Airflow rejected user {self._username!r} at {self._shown} (HTTP {status} "
                f"{detail}): check DUPGUARD_AIRFLOW_USERNAME / DUPGUARD_AIRFLOW_PASSWORD; "
                f"next attempt in {delay:.0f} s"
            )
        token = _json(response.data).get("access_token") if 200 <= status < 300 else None
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


class ApiBackend:
    name = "api"

    def __init__(
        self,
        client: ApiClient,
        tokens: TokenSource,
        *,
        engine: Engine,
        tables: AirflowTables,
        base_url: str,
        timeout: float,
        attempts: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.tokens = tokens
        self.engine = engine  # the read-back after each write
        self.tables = tables
        self.base_url = base_url
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.sleep = sleep
        self.dag_runs = DagRunApi(client)
        self.task_instances = TaskInstanceApi(client)

    @classmethod
    def from_config(
        cls,
        config: Config,
        engine: Engine,
        tables: AirflowTables,
        *,
        auth_backoff: float = 60.0,
        clock: Callable[[], float] = time.time,
        **options: Any,
    ) -> ApiBackend:
        if not config.airflow_api_url:
            raise AirflowApiError("the api backend needs DUPGUARD_AIRFLOW_API_URL")
        if config.remediation == Mode.SKIP.value and tables.family in _SKIP_UNDONE:
            raise ConfigError(
                [
                    f"DUPGUARD_REMEDIATION=skip with DUPGUARD_REMEDIATION_BACKEND=api is refused on Airflow "
                    f"{tables.family.value}: its scheduler can put the skipped tasks back (DagRun.schedule_tis); "
                    "use DUPGUARD_REMEDIATION=fail, or skip with DUPGUARD_REMEDIATION_BACKEND=db"
                ]
            )
        client = make_client(config)
        timeout = config.airflow_timeout.total_seconds()
        tokens = TokenSource(
            client,
            config.airflow_api_url,
            username=config.airflow_username,
            password=config.airflow_password,
            static_token=config.airflow_token,
            timeout=timeout,
            auth_backoff=auth_backoff,
            clock=clock,
        )
        return cls(
            client, tokens, engine=engine, tables=tables, base_url=config.airflow_api_url, timeout=timeout, **options
        )

    def close(self) -> None:
        self.client.rest_client.pool_manager.clear()

    def prepare(self) -> None:
        """Hold a fresh token before any duplicate needs it: POST /auth/token costs ~0.5 s, longer than
        the ~100 ms a duplicate's first task waits. A no-op while the cached token is fresh; wrong
        credentials stay behind TokenSource's back-off, so this never becomes a login storm."""
        try:
            self.tokens.get(_Budget())
        except (AirflowApiError, _Transient) as exc:
            log.warning("airflow_token_unavailable", error=str(exc))

    # --- one action ---------------------------------------------------------------------------------

    def apply(self, action: Action, work: Work, recheck: Recheck) -> Applied:
        budget = _Budget()
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                self._apply_once(action, work, budget)
                committed = now_utc()
                return self._read_back(action, work, committed)
            except _Gone as exc:
                return Applied(Result.GONE, f"HTTP 404 from the Airflow API: {exc}")
            except AirflowAuthError as exc:
                return Applied(Result.FAILED, str(exc))
            except _Transient as exc:
                last = str(exc)
            if attempt == self.attempts:
                break
            self.sleep(min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))
            landed = self._landed(action, work)  # a timed-out PATCH may have been applied all the same
            if landed is not None:
                return Applied(
                    landed.result,
                    f"{landed.detail} (applied although the attempt failed: {last})",
                    committed_at=landed.committed_at,
                    started_tasks=landed.started_tasks,
                )
            verdict = recheck()  # the run may have started, finished or vanished meanwhile
            if verdict.work is None:
                assert verdict.result is not None
                if verdict.result is Result.ALREADY:
                    # An attempt that timed out on our side may well have been applied.
                    return Applied(
                        Result.DONE, f"{verdict.detail} (after a failed attempt: {last})", committed_at=now_utc()
                    )
                return Applied(verdict.result, f"{verdict.detail} (after a failed attempt: {last})")
            work = verdict.work
            log.info("remediation_retry", dag_id=action.dag_id, run_id=action.run.run_id, attempt=attempt, error=last)
        landed = self._landed(action, work)
        if landed is not None:
            return Applied(
                landed.result,
                f"{landed.detail} (applied although the last attempt failed: {last})",
                committed_at=landed.committed_at,
                started_tasks=landed.started_tasks,
            )
        shown = redact.web_url(self.base_url)
        return Applied(Result.FAILED, f"Airflow API at {shown} failed {self.attempts} times: {last}")

    def _landed(self, action: Action, work: Work) -> Applied | None:
        """After a failed attempt: if the run carries this action's note, Airflow applied the PATCH
        (``fail`` sends state and note in one request, ``skip`` sends the note last), so judge it
        by the read-back; None when it did not land (or cannot be told), so the caller re-checks."""
        try:
            with connect(self.engine) as conn:
                after = queries.run_state(conn, self.tables, action.dag_id, action.run.run_id)
                note = queries.run_note(conn, self.tables, after.id) if after is not None else None
        except DupguardError:
            return None
        if after is None or note != action.note:
            return None
        checked = read_back(action.mode, (*work.to_fail, *work.to_skip), work.describe(), after)
        return Applied(checked.result, checked.detail, committed_at=now_utc(), started_tasks=checked.started)

    def _read_back(self, action: Action, work: Work, committed: datetime) -> Applied:
        """The run as Airflow left it, judged against the guard's re-read (detector.actions.remediation.readback).

        The PATCH has been answered, so its transaction committed; a failing read still reports the
        write (as done, saying the read-back failed) rather than hiding it.
        """
        try:
            with connect(self.engine) as conn:
                after = queries.run_state(conn, self.tables, action.dag_id, action.run.run_id)
        except DupguardError as exc:
            return Applied(Result.DONE, f"{work.describe()} (read-back failed: {exc})", committed_at=committed)
        checked = read_back(action.mode, (*work.to_fail, *work.to_skip), work.describe(), after)
        return Applied(checked.result, checked.detail, committed_at=committed, started_tasks=checked.started)

    def _apply_once(self, action: Action, work: Work, budget: _Budget) -> None:
        dag_id, run_id = action.dag_id, action.run.run_id
        if action.mode is Mode.FAIL:
            body = DAGRunPatchBody(state=DagRunMutableStates.FAILED, note=action.note)
            self._call(
                "PATCH dagRun state=failed",
                lambda h: self.dag_runs.patch_dag_run_without_preload_content(
                    dag_id, run_id, body, _request_timeout=self.timeout, _headers=h
                ),
                budget,
            )
            return
        if work.to_skip or work.to_fail:
            self._skip_tasks(dag_id, run_id, work, budget)
        note = DAGRunPatchBody(note=action.note)
        self._call(
            "PATCH dagRun note",
            lambda h: self.dag_runs.patch_dag_run_without_preload_content(
                dag_id, run_id, note, update_mask=["note"], _request_timeout=self.timeout, _headers=h
            ),
            budget,
        )

    def _skip_tasks(self, dag_id: str, run_id: str, work: Work, budget: _Budget) -> None:
        tasks = (*work.to_skip, *work.to_fail)
        bulk = BulkBodyBulkTaskInstanceBody.from_dict(
            {
                "actions": [
                    {
                        "action": "update",
                        "entities": [
                            {"task_id": ti.task_id, "map_index": ti.map_index, "new_state": "skipped"} for ti in tasks
                        ],
                    }
                ]
            }
        )
        assert bulk is not None
        answer = self._call(
            "PATCH taskInstances (bulk skip)",
            lambda h: self.task_instances.bulk_task_instances_without_preload_content(
                dag_id, run_id, bulk, _request_timeout=self.timeout, _headers=h
            ),
            budget,
        )
        errors = (answer.get("update") or {}).get("errors") or []
        if errors:
            if any(isinstance(e, dict) and e.get("status_code") == 404 for e in errors):
                raise _Gone(f"bulk skip: {errors}")
            raise AirflowApiError(f"bulk skip of {dag_id}/{run_id} reported errors: {errors}")

    # --- one HTTP call ------------------------------------------------------------------------------

    def _call(self, what: str, send: Callable[[Headers], Any], budget: _Budget) -> dict[str, Any]:
        for _ in range(2):  # the second pass only after a 401 with a cached token
            status, data = self._send(what, send, self.tokens.get(budget))
            # 401 "Token Expired"; 403 "Invalid JWT token" (e.g. jwt_secret rotated): a new token may do.
            if status == 401 or (status == 403 and "invalid jwt" in _detail(data, self.tokens.secrets()).lower()):
                self.tokens.invalidate()
                if self.tokens.static:
                    raise AirflowAuthError(
                        f"{what}: HTTP 401, the static DUPGUARD_AIRFLOW_TOKEN was rejected (expired?)"
                    )
                continue  # tokens.get() fetches a new one, or raises when this action already did
            if status == 403:
                detail = _detail(data, self.tokens.secrets())
                raise AirflowAuthError(
                    f"{what}: HTTP 403 {detail}: the Airflow user needs a role that may edit "
                    "DAG runs and task instances (FAB: User, Op or Admin; simple auth manager: user or higher)"
                )
            if status == 404:
                raise _Gone(f"{what}: {_detail(data, self.tokens.secrets())}")
            if status >= 500:
                raise _Transient(f"{what}: HTTP {status} {_detail(data, self.tokens.secrets())}")
            if not 200 <= status < 300:
                raise AirflowApiError(f"{what}: HTTP {status} {_detail(data, self.tokens.secrets())}")
            return _json(data)
        raise AirflowAuthError(f"{what}: a freshly issued token was rejected too")

    def _send(self, what: str, send: Callable[[Headers], Any], token: str) -> tuple[int, bytes]:
        try:
            response = send({"Authorization": f"Bearer {token}"})
            data = response.data  # reads the body (and releases the connection to the pool)
            return int(response.status), bytes(data or b"")
        except urllib3.exceptions.HTTPError as exc:
            raise _Transient(f"{what}: {_transport(exc)}") from None
        except ApiException as exc:
            raise AirflowApiError(f"{what}: {_api_exception(exc)}") from None


def make_client(config: Config) -> ApiClient:
    """An ApiClient with TLS verification on (optionally against a CA bundle) and no hidden retries.

    urllib3's default retries would repeat a PATCH on connection errors without our guard's
    re-check in between; ``ApiBackend`` retries itself.
    """
    assert config.airflow_api_url is not None
    cfg = Configuration(host=config.airflow_api_url)
    cfg.verify_ssl = config.airflow_verify_tls
    if config.airflow_ca_bundle:
        cfg.ssl_ca_cert = config.airflow_ca_bundle
    cfg.retries = False
    return ApiClient(cfg)


def _json(data: bytes | None) -> dict[str, Any]:
    try:
        parsed = json.loads(data or b"{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _detail(data: bytes | None, secrets: tuple[str | None, ...] = ()) -> str:
    """The ``detail`` of an error body, safe to log: secret-named fields (and the ``input`` a
    validation error echoes for them) masked by parsing; free text holding a secret withheld whole
    (Airflow's /auth/token answers a malformed login with ``repr(ValidationError)``, which quotes
    ``input_value={...'password': ...}``)."""
    detail = redact.mask_fields(_json(data).get("detail"))
    if detail is None:
        return ""
    text = detail if isinstance(detail, str) else json.dumps(detail)
    return redact.withhold(text, secrets)[:300]


def _transport(exc: urllib3.exceptions.HTTPError) -> str:
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return "connection refused or unreachable (is the API server up?)"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return "timed out"
    return type(exc).__name__


def _api_exception(exc: ApiException) -> str:
    reason = (exc.reason or "").splitlines()
    if reason and reason[0] == "SSLError":
        return (
            "TLS error: "
            + (reason[1] if len(reason) > 1 else "certificate verification failed")
            + (" (set DUPGUARD_AIRFLOW_CA_BUNDLE to the CA that signed the API's certificate)")
        )
    return (reason[0] if reason else type(exc).__name__)[:300]

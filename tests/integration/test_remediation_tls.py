"""Backend ``api`` over TLS: a real Airflow 3.1.2 API server with a throw-away CA's certificate.

The settings come through ``config.load`` from the real environment variable names
(``DUPGUARD_AIRFLOW_CA_BUNDLE``, ``DUPGUARD_AIRFLOW_VERIFY_TLS``), so what is tested is what an
operator sets. The user is ``dupguard`` with role ``user`` (the documented minimum) and a random
password the auth manager generated, so "no secret in the logs" is a real check.
One server for the module; each test re-creates the live database from ``race_asset_fanout``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3
from structlog.testing import capture_logs

from detector import config as config_module
from detector.actions.remediation.api import ApiBackend
from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.core.plan import Action, Mode, Outcome, plan
from detector.core.ports import RemediationResult, Result
from detector.errors import ConfigError
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import AirflowServer, TlsFiles, airflow_api_server, db_state, make_test_ca
from tests.pg import Templates, ground_truth

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

VERSION = "3.1.2"
FANOUT = "race_asset_fanout"  # 3 consumer DAGs, a duplicate pair each, nothing started
USER = "dupguard"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_test_ca(tmp_path_factory.mktemp("tls-ca"))


@pytest.fixture(scope="module")
def af312_tls(
    pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles
) -> Iterator[AirflowServer]:
    workdir = tmp_path_factory.mktemp("af312-tls")
    users = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,viewer:viewer,{USER}:user"}
    with airflow_api_server(VERSION, [FANOUT], pg_templates, workdir, env=users, tls=tls_files) as server:
        # The simple auth manager generated a random password for the user missing from the file.
        passwords = json.loads((workdir / f"airflow-home-{VERSION}" / "passwords.json").read_text())
        server.extra["password"] = passwords[USER]
        yield server


class Live:
    """The live database's planned actions, and remediators built from environment variables."""

    def __init__(self, server: AirflowServer) -> None:
        self.server = server
        self.url = server.reset(FANOUT)
        self.engine = make_engine(parse_url(self.url))
        self.db = open_airflow_db(self.engine)
        self.made: list[GuardedRemediator] = []

    @property
    def password(self) -> str:
        return str(self.server.extra["password"])

    def actions(self, mode: Mode) -> list[Action]:
        now = datetime.now(UTC)
        return plan(scan(self.db, now=now).findings, mode, now=now)

    def remediator(self, mode: Mode, **env: str) -> GuardedRemediator:
        config = config_module.load(
            env={
                "DUPGUARD_DATABASE_URL": self.url,
                "DUPGUARD_REMEDIATION": mode.value,
                "DUPGUARD_REMEDIATION_BACKEND": "api",  # TLS to the API is the subject (auto may pick db)
                "DUPGUARD_AIRFLOW_API_URL": self.server.url,
                "DUPGUARD_AIRFLOW_USERNAME": USER,
                "DUPGUARD_AIRFLOW_PASSWORD": self.password,
                **env,
            }
        )
        remediator = build_remediator(config, self.engine, self.db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        self.made.append(remediator)
        return remediator

    def close(self) -> None:
        for remediator in self.made:
            remediator.close()
        self.engine.dispose()


@pytest.fixture
def live(af312_tls: AirflowServer) -> Iterator[Live]:
    assert af312_tls.url.startswith("https://127.0.0.1:")
    harness = Live(af312_tls)
    yield harness
    harness.close()


def _run_all(remediator: GuardedRemediator, actions: list[Action]) -> tuple[list[RemediationResult], str]:
    """Execute every action; also return everything dupguard logged meanwhile, as one text."""
    with capture_logs() as logs:
        results = [remediator.execute(a) for a in actions]
    return results, json.dumps(logs, default=str)


def _assert_failed_and_noted(live: Live, actions: list[Action], before: dict[str, Any]) -> None:
    """Each duplicate failed with its TIs skipped and the note (by the API user); everything else unchanged."""
    after = db_state(live.url)
    targets = {a.run.run_id for a in actions}
    for action in actions:
        row = after[action.run.run_id]
        assert row.state == "failed" and row.end_date is not None
        assert {name: ti[0] for name, ti in row.tasks.items()} == {"extract": "skipped", "load": "skipped"}
        assert row.note == action.note and row.note_user == USER
        kept = after[action.kept_run_id]
        assert kept == before[action.kept_run_id] and kept.state == "queued" and kept.note is None
    assert before.keys() == after.keys()
    for run_id, row in before.items():
        if run_id not in targets:
            assert after[run_id] == row, f"{run_id} changed but was not a target"


def _assert_no_secret(live: Live, remediator: GuardedRemediator, text: str) -> None:
    assert live.password not in text
    assert "Bearer" not in text and "access_token" not in text
    backend = remediator.backend
    assert isinstance(backend, ApiBackend)
    if backend.tokens._token is not None:
        assert backend.tokens._token not in text


def test_ca_bundle_verifies_the_server_and_fail_works_end_to_end(live: Live, tls_files: TlsFiles) -> None:
    """DUPGUARD_AIRFLOW_CA_BUNDLE = the CA that signed the server's certificate: verified, and fail is DONE."""
    actions = live.actions(Mode.FAIL)
    assert len(actions) == 3 and all(a.outcome is Outcome.REMEDIATE for a in actions)
    before = db_state(live.url)
    remediator = live.remediator(Mode.FAIL, DUPGUARD_AIRFLOW_CA_BUNDLE=str(tls_files.ca_cert))
    results, logged = _run_all(remediator, actions)

    assert [r.result for r in results] == [Result.DONE] * 3, [r.detail for r in results]
    _assert_failed_and_noted(live, actions, before)
    truth = ground_truth(VERSION, FANOUT)
    assert sorted(a.kept_run_id for a in actions) == sorted(g["first_run_id"] for g in truth["expected_groups"])
    backend = remediator.backend
    assert isinstance(backend, ApiBackend) and backend.tokens.requests_sent == 1
    assert backend.tokens._token  # a token was issued over TLS ...
    _assert_no_secret(live, remediator, logged)  # ... and appears nowhere in the logs


@pytest.mark.parametrize(
    "ca",
    [None, "other"],
    ids=["default-verification-system-CAs", "ca-bundle-of-an-unrelated-CA"],
)
def test_an_unverifiable_certificate_fails_clearly_and_changes_nothing(
    live: Live, tls_files: TlsFiles, ca: str | None
) -> None:
    """Verification is on by default: the system CAs (or a bundle with the wrong CA) do not know the
    server's issuer. FAILED with one line naming TLS and the certificate, no retries, nothing written."""
    actions = live.actions(Mode.FAIL)
    before = db_state(live.url)
    env = {} if ca is None else {"DUPGUARD_AIRFLOW_CA_BUNDLE": str(tls_files.other_ca_cert)}
    remediator = live.remediator(Mode.FAIL, **env)
    started = time.monotonic()
    results, logged = _run_all(remediator, actions[:1])
    elapsed = time.monotonic() - started

    (result,) = results
    assert result.result is Result.FAILED
    detail = result.detail
    assert "\n" not in detail and len(detail) < 600, detail
    assert "TLS error" in detail and "CERTIFICATE_VERIFY_FAILED" in detail, detail
    assert "DUPGUARD_AIRFLOW_CA_BUNDLE" in detail and live.server.url in detail
    assert "times" not in detail and elapsed < 5  # a certificate problem is not retried
    assert db_state(live.url) == before
    backend = remediator.backend
    assert isinstance(backend, ApiBackend) and backend.tokens.requests_sent == 0  # never reached the server
    _assert_no_secret(live, remediator, logged)
    (line,) = [e for e in json.loads(logged) if e.get("event") == "remediation"]
    assert line["log_level"] == "warning" and line["result"] == "failed" and line["detail"] == detail


def test_verify_tls_false_works_without_a_ca_and_urllib3_warns(live: Live) -> None:
    """DUPGUARD_AIRFLOW_VERIFY_TLS=false: no verification, the action is DONE. dupguard itself logs no
    warning about it; urllib3 emits InsecureRequestWarning (Python warnings) for each request."""
    actions = live.actions(Mode.FAIL)
    before = db_state(live.url)
    remediator = live.remediator(Mode.FAIL, DUPGUARD_AIRFLOW_VERIFY_TLS="false")
    with pytest.warns(urllib3.exceptions.InsecureRequestWarning):
        results, logged = _run_all(remediator, actions)
    assert [r.result for r in results] == [Result.DONE] * 3, [r.detail for r in results]
    _assert_failed_and_noted(live, actions, before)
    _assert_no_secret(live, remediator, logged)


def test_the_ca_bundle_setting_must_name_a_file(live: Live, tmp_path: Path) -> None:
    """A CA bundle path that does not exist is a configuration error at start-up, not a TLS failure later."""
    with pytest.raises(ConfigError, match=r"DUPGUARD_AIRFLOW_CA_BUNDLE: invalid value .*: no such file"):
        live.remediator(Mode.FAIL, DUPGUARD_AIRFLOW_CA_BUNDLE=str(tmp_path / "missing.pem"))

"""Auth to Airflow's REST API (detector.airflowapi) against a real Airflow 3.1.2 API server.

The three ways in (static token, username/password through ``POST /auth/token``, the token command)
each make a real read (``GET /api/v2/dags/~/dagRuns``) that the server answers with the runs it
holds; the token command's tokens are minted by the server itself (a script calls /auth/token) or
are ones it refuses (expired, signed with another key). Failures of the command (exit code,
timeout, empty or odd output) are one-line ``AirflowAuthError``s that quote no secret and are
retried after a back-off, never raised as anything else.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from detector.airflowapi import permissions
from detector.airflowapi.session import Session
from detector.airflowapi.tokens import Budget, jwt_claims
from detector.config import Config
from detector.errors import AirflowAuthError
from tests.airflow_server import JWT_SECRET, AirflowServer, CountingProxy, airflow_api_server
from tests.integration.test_remediation_api import _jwt
from tests.pg import Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

SCENARIO = "race_asset_fanout"  # 3 consumer DAGs with a duplicate pair each: 6 asset-triggered runs
RUNS = "/api/v2/dags/~/dagRuns"
MINT = """\
import json, sys, urllib.request
request = urllib.request.Request(
    sys.argv[1] + "/auth/token",
    data=json.dumps({"username": "admin", "password": "admin"}).encode(),
    headers={"Content-Type": "application/json"},
)
token = json.load(urllib.request.urlopen(request, timeout=10))["access_token"]
if len(sys.argv) > 2:
    open(sys.argv[2], "a").write(token + "\\n")  # what the test greps the outputs for
print(token)
"""


@pytest.fixture(scope="module")
def server(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    with airflow_api_server(
        "3.1.2", [SCENARIO], pg_templates, tmp_path_factory.mktemp("auth312"), jwt_expiration=600
    ) as started:
        yield started


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _session(server_url: str, clock: Clock | None = None, **settings: Any) -> Session:
    config = Config.of(database_url="sqlite://", airflow_api_url=server_url, **settings)
    return Session.from_config(config, clock=clock or time.time)


def _asset_runs(session: Session, budget: Budget | None = None) -> int:
    answer = session.request(
        "GET", RUNS, query={"run_type": ["asset_triggered"]}, budget=budget, needs=permissions.READ_RUNS
    )
    return int(answer["total_entries"])


def _mint_command(tmp_path: Path, url: str, *, log: Path | None = None) -> str:
    script = tmp_path / "mint.py"
    script.write_text(MINT)
    return f"{sys.executable} {script} {url}" + (f" {log}" if log else "")


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


# --- the three ways in ------------------------------------------------------------------------------


def test_username_and_password_get_one_token_from_the_server(server: AirflowServer) -> None:
    with CountingProxy(server.port) as proxy:
        session = _session(proxy.url, airflow_username="admin", airflow_password="admin")
        assert [_asset_runs(session) for _ in range(3)] == [6, 6, 6]  # what Airflow recorded (fanout scenario)
        assert proxy.count("POST", "/auth/token") == 1  # cached for the next calls
        session.close()


def test_a_static_token_is_sent_as_is_and_never_renewed(server: AirflowServer) -> None:
    """An Astronomer Deployment API token: no /auth/token call, the token in the header as given."""
    minter = _session(server.url, airflow_username="admin", airflow_password="admin")
    token = minter.tokens.get(Budget())
    minter.close()
    with CountingProxy(server.port) as proxy:
        session = _session(proxy.url, airflow_token=token)
        assert _asset_runs(session) == 6
        assert proxy.count("POST", "/auth/token") == 0
        session.close()
    expired = _session(server.url, airflow_token=_jwt(key=JWT_SECRET, exp_in=-30))
    with pytest.raises(AirflowAuthError, match="static DUPGUARD_AIRFLOW_TOKEN was rejected"):
        _asset_runs(expired)
    expired.close()


def test_the_token_command_is_run_once_and_again_before_exp(server: AirflowServer, tmp_path: Path) -> None:
    """The command's stdout is the token; it runs again once the clock passes the refresh point
    (exp - min(60 s, 20 % of the lifetime)), before the server would refuse the token."""
    minted = tmp_path / "minted"
    clock = Clock()
    with CountingProxy(server.port) as proxy:
        command = _mint_command(tmp_path, server.url, log=minted)
        session = _session(proxy.url, clock, airflow_token_command=command)
        assert [_asset_runs(session) for _ in range(3)] == [6, 6, 6]
        assert session.tokens.commands_run == 1
        first = minted.read_text().split()
        exp = jwt_claims(first[0])["exp"]
        clock.now = exp - 61  # 600 s lifetime: refreshed 60 s before exp
        assert _asset_runs(session) == 6 and session.tokens.commands_run == 1
        clock.now = exp - 59
        assert _asset_runs(session) == 6 and session.tokens.commands_run == 2
        assert len(minted.read_text().split()) == 2
        assert proxy.count("GET", RUNS) == 5  # each answered on the first try: no 401, no resend
        session.close()


@pytest.mark.parametrize(
    "refused",
    [lambda: _jwt(key=JWT_SECRET, exp_in=-30), lambda: _jwt(key="not-the-server-key", exp_in=3600)],
    ids=["expired-401", "wrong-key-403-invalid-jwt"],
)
def test_a_refused_token_makes_the_command_run_again(server: AirflowServer, tmp_path: Path, refused: Any) -> None:
    """The cached token's ``exp`` may say nothing useful (an opaque token, a revoked or rotated key):
    the server's refusal decides, and the command runs again once."""
    with CountingProxy(server.port) as proxy:
        session = _session(proxy.url, airflow_token_command=_mint_command(tmp_path, server.url))
        assert _asset_runs(session) == 6 and session.tokens.commands_run == 1
        session.tokens._token = refused()
        session.tokens._refresh_at = float("inf")  # as if it had no exp: only the server can refuse it
        assert _asset_runs(session) == 6
        assert session.tokens.commands_run == 2
        assert proxy.count("GET", RUNS) == 3  # one refused, then answered
        session.close()


def test_a_command_printing_a_token_the_server_refuses_backs_off(server: AirflowServer, tmp_path: Path) -> None:
    clock = Clock()
    command = _script(tmp_path, "refused.sh", f"echo {_jwt(key='not-the-server-key', exp_in=3600)}\n")
    session = _session(server.url, clock, airflow_token_command=command)
    with pytest.raises(AirflowAuthError, match=r"token it just printed was rejected by http://127\.0\.0\.1:") as first:
        _asset_runs(session)
    assert "next attempt in 5 s" in str(first.value)
    with pytest.raises(AirflowAuthError, match="failed earlier"):
        _asset_runs(session)
    assert session.tokens.commands_run == 1  # no loop, no command storm
    session.close()


# --- a failing command: one line, no secret, a retry after a back-off ---------------------------------


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ("echo part-MkStdout1; echo 'gcloud: not logged in' >&2; exit 3\n", "exit code 3: gcloud: not logged in"),
        ("exit 0\n", "printed nothing on stdout"),
        ("echo 'Token: MkStdout1 (valid 1h)'\n", "printed more than the token"),
    ],
    ids=["exit-code", "empty", "chatty"],
)
def test_a_failing_command_is_a_one_line_error_and_retried_after_a_back_off(
    server: AirflowServer, tmp_path: Path, body: str, says: str
) -> None:
    clock = Clock()
    session = _session(server.url, clock, airflow_token_command=_script(tmp_path, "cmd.sh", body))
    with pytest.raises(AirflowAuthError) as first:
        _asset_runs(session)
    message = str(first.value)
    assert says in message and "next attempt in 5 s" in message
    assert "\n" not in message and "MkStdout1" not in message  # stdout is never quoted
    with pytest.raises(AirflowAuthError) as again:
        _asset_runs(session)
    reason = message.split("(", 1)[1].split("); next", 1)[0]
    assert f"failed earlier ({reason}); next attempt in 5 s" in str(again.value)  # the reason repeated
    assert session.tokens.commands_run == 1  # not run again inside the back-off
    clock.now += 6
    with pytest.raises(AirflowAuthError, match="next attempt in 10 s"):  # run again, then a longer back-off
        _asset_runs(session)
    assert session.tokens.commands_run == 2
    session.close()


def test_a_command_that_hangs_is_killed_with_its_children(server: AirflowServer, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = _script(tmp_path, "hang.sh", f'sleep 60 & echo $! > "{pids}"; wait\n')
    session = _session(
        server.url, airflow_token_command=command, airflow_token_command_timeout=timedelta(milliseconds=500)
    )
    started = time.monotonic()
    with pytest.raises(AirflowAuthError, match=r"timed out after 0.5 s"):
        _asset_runs(session)
    assert time.monotonic() - started < 30  # not the 60 s of the child
    child = int(pids.read_text())
    assert not _alive(child), "the command's child outlived the timeout"
    session.close()


def _alive(pid: int) -> bool:
    for _ in range(50):  # the orphan is reaped by init shortly after the kill
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state in {"Z", "X"}:
            return False
        time.sleep(0.1)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- permissions ------------------------------------------------------------------------------------


def test_a_missing_permission_is_one_line_naming_it(server: AirflowServer) -> None:
    """A viewer may read runs but not edit them: Airflow answers a bare 403 "Forbidden"; the error
    names the permission (FAB) and the role (simple auth manager)."""
    session = _session(server.url, airflow_username="viewer", airflow_password="viewer")
    assert _asset_runs(session) == 6  # reading is allowed
    runs = session.request("GET", RUNS, query={"run_type": ["asset_triggered"]}, needs=permissions.READ_RUNS)
    run = runs["dag_runs"][0]
    with pytest.raises(AirflowAuthError) as denied:
        session.request(
            "PATCH",
            f"/api/v2/dags/{run['dag_id']}/dagRuns/{run['dag_run_id']}",
            query={"update_mask": ["note"]},
            body={"note": "dupguard permission probe"},
            needs=permissions.EDIT_RUNS,
        )
    message = str(denied.value)
    assert "HTTP 403" in message and "\n" not in message
    assert '"can edit" on DAGs and DAG Runs' in message and "role user or higher" in message
    session.close()

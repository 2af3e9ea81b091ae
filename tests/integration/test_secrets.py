"""No secret in any output: marker secrets planted in every place a secret can be given, every output
channel grepped for them.

Places: flags, env vars, ``<VAR>_FILE`` files, the YAML file; database URLs with the password in
the userinfo, in ``?password=``, and containing ``@``; an API URL with userinfo. Channels: the logs
and errors (stderr) of real ``dupguard`` processes (a daemon that detects a real duplicate, alerts
and tries to remediate; ``run --once``; ``scan``/``init-db`` errors; bad configuration), ``/metrics``,
what the local Slack server and webhook receiver (tests/slack_server.py) received, ``--help`` and
``check-config``. The test PostgreSQL trusts local connections, so marker passwords still connect.

The token command (``DUPGUARD_AIRFLOW_TOKEN_COMMAND``) against a real Airflow 3.1.2 API server: the
command's text, the tokens it printed (minted by the server, recorded by the command for the grep)
and the stdout of a failing command appear in no output of ``run --once`` that remediates through it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.airflow_server import airflow_api_server, db_state
from tests.daemon_harness import wait_for
from tests.integration.test_airflow_auth import MINT
from tests.pg import Templates
from tests.slack_server import SlackServer
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
DUPGUARD = str(Path(sys.executable).parent / "dupguard")

M = {
    "db_userinfo": "MkDbUserinfo1",
    "db_query": "MkDbQuery2",
    "db_at_head": "MkDbAt3",
    "db_at_tail": "tailMk3x",  # the part after a raw "@" in the password
    "lock": "MkLockPw4",
    "af_password": "MkAfPass5",
    "af_token": "MkAfToken6",
    "slack_bot": "xoxb-MkSlackBot7",
    "slack_hook": "MkSlackHook8",
    "webhook": "MkWebhook9",
    "api_userinfo": "MkApiUserinfo10",
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with_password(url: str, password: str) -> str:
    u = make_url(url)
    return f"postgresql://{u.username}:{password}@{u.host}:{u.port}/{u.database}"


def _clean_env(**extra: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | extra


def _leaks(text: str) -> list[str]:
    return [name for name, marker in M.items() if marker in text]


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_no_marker_secret_in_any_output(pg_templates: Templates, tmp_path: Path) -> None:
    url = pg_templates.clone("3.1.2")
    u = make_url(url)
    slack = SlackServer(token=M["slack_bot"], webhook_path=f"/services/T0/B0/{M['slack_hook']}")
    slack.generic_path = f"/generic/{M['webhook']}"
    api_down = f"http://admin:{M['api_userinfo']}@127.0.0.1:{_free_port()}"
    outputs: dict[str, str] = {}
    try:
        # 1. The daemon: URL from _FILE (userinfo password), lock URL by flag (?password=), Slack bot token
        #    from env, Slack webhook URL from env (ignored next to the bot: still a secret given), generic
        #    webhook and Airflow password from YAML, remediation through an API that is down.
        url_file = tmp_path / "db-url"
        url_file.write_text(_with_password(url, M["db_userinfo"]) + "\n")
        cfg = tmp_path / "dupguard.yaml"
        cfg.write_text(
            f"webhook_url: {slack.generic_url}\n"
            f"airflow_password: {M['af_password']}\n"
            "airflow_username: admin\n"
            f"airflow_api_url: {api_down}\n"
            "remediation: fail\n"
            "remediation_backend: api\n"
        )
        port = _free_port()
        env = _clean_env(
            DUPGUARD_DATABASE_URL_FILE=str(url_file),
            DUPGUARD_SLACK_BOT_TOKEN=M["slack_bot"],
            DUPGUARD_SLACK_CHANNEL="#airflow-alerts",
            DUPGUARD_SLACK_API_URL=slack.api_url,
            DUPGUARD_SLACK_WEBHOOK_URL=slack.webhook_url,
            DUPGUARD_LOG_FORMAT="json",
            DUPGUARD_LOG_LEVEL="debug",
            DUPGUARD_HTTP_PORT=str(port),
            DUPGUARD_LEADER_CHECK_INTERVAL="250ms",
        )
        lock_url = f"postgresql://{u.username}@{u.host}:{u.port}/{u.database}?password={M['lock']}"
        log = tmp_path / "daemon.log"
        with log.open("wb") as out:
            daemon = subprocess.Popen(
                [DUPGUARD, "run", "--config", str(cfg), "--lock-database-url", lock_url],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(lambda: "dupguard_leader 1.0" in _metrics_or_empty(port), timeout=30, what="leadership")
            writer = AirflowWriter(url)
            writer.duplicate_pair("consumer_secrets")
            writer.close()
            wait_for(lambda: bool(slack.top_level()) and bool(slack.generic_payloads), timeout=30, what="alerts")
            wait_for(lambda: "remediation" in log.read_text() and "failed" in log.read_text(), timeout=30, what="try")
            outputs["/metrics"] = _metrics(port)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(20)
        outputs["daemon log"] = log.read_text()
        assert "duplicate_detected" in outputs["daemon log"]
        outputs["slack"] = json.dumps([m.__dict__ for m in slack.messages.values()], default=str)
        outputs["webhooks"] = json.dumps([slack.webhook_messages, slack.generic_payloads], default=str)
        outputs["slack requests"] = "\n".join(slack.requests).replace(M["slack_hook"], "").replace(M["webhook"], "")

        # 2. run --once: a password containing "@" (flag), a static token (flag), Slack webhook from _FILE.
        hook_file = tmp_path / "hook"
        hook_file.write_text(slack.webhook_url)
        at_url = _with_password(url, f"{M['db_at_head']}@{M['db_at_tail']}")
        once = subprocess.run(
            [DUPGUARD, "run", "--once", "--database-url", at_url, "--airflow-token", M["af_token"]],
            env=_clean_env(DUPGUARD_SLACK_WEBHOOK_URL_FILE=str(hook_file), DUPGUARD_LOG_FORMAT="json"),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert once.returncode == 0, once.stderr
        outputs["run --once"] = once.stdout + once.stderr

        # 3. Errors: unreachable databases in every URL form; init-db from _FILE; bad settings next to secrets.
        dead = f"127.0.0.1:{_free_port()}"
        for form in (
            f"postgresql://airflow:{M['db_userinfo']}@{dead}/airflow",
            f"postgresql://airflow@{dead}/airflow?password={M['db_query']}&sslmode=disable",
            f"postgresql://airflow:{M['db_at_head']}@{M['db_at_tail']}@{dead}/airflow",
            f"postgresql://airflow@{dead}/airflow?password={M['db_at_head']}@{M['db_at_tail']}",
        ):
            for argv in (["scan", "--database-url", form], ["run", "--once", "--database-url", form]):
                done = subprocess.run([DUPGUARD, *argv], env=_clean_env(), capture_output=True, text=True, timeout=60)
                assert done.returncode == 3, done.stderr
                outputs[f"{argv[0]} error {form}"] = done.stdout + done.stderr
        done = subprocess.run(
            [DUPGUARD, "init-db"],
            env=_clean_env(DUPGUARD_DATABASE_URL_FILE=str(url_file).replace("db-url", "missing")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        outputs["init-db error"] = done.stdout + done.stderr
        bad = subprocess.run(
            [DUPGUARD, "run", "--webhook-url", f"ftp://{M['webhook']}", "--slack-bot-token", M["slack_bot"]],
            env=_clean_env(
                DUPGUARD_AIRFLOW_PASSWORD=M["af_password"], DUPGUARD_DATABASE_URL=f"mysql://u:{M['db_userinfo']}@h/db"
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 2
        outputs["config error"] = bad.stderr

        # 4. --help and check-config with every secret given.
        all_env = _clean_env(
            DUPGUARD_DATABASE_URL=_with_password(url, M["db_userinfo"]),
            DUPGUARD_SLACK_BOT_TOKEN=M["slack_bot"],
            DUPGUARD_SLACK_CHANNEL="#a",
            DUPGUARD_AIRFLOW_TOKEN_FILE=str(tmp_path / "token"),
        )
        (tmp_path / "token").write_text(M["af_token"])
        for argv in (
            ["run", "--help"],
            ["check-config", "--help"],
            ["scan", "--help"],
            ["check-config", "--config", str(cfg), "--lock-database-url", lock_url, "--webhook-url", slack.generic_url],
        ):
            done = subprocess.run([DUPGUARD, *argv], env=all_env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            outputs[" ".join(argv[:2])] = done.stdout + done.stderr
    finally:
        slack.stop()
    assert "airflow_password: '***'" in outputs["check-config --config"]
    leaks = {channel: _leaks(text) for channel, text in outputs.items() if _leaks(text)}
    assert leaks == {}, leaks


def _metrics_or_empty(port: int) -> str:
    try:
        return _metrics(port)
    except OSError:
        return ""


def test_no_token_command_secret_in_any_output(pg_templates: Templates, tmp_path: Path) -> None:
    cmd_marker, stdout_marker = "MkCmdText11", "MkCmdStdout12"
    minted = tmp_path / "minted"
    script = tmp_path / "mint.py"
    script.write_text(MINT)
    outputs: dict[str, str] = {}
    with airflow_api_server("3.1.2", ["race_asset_fanout"], pg_templates, tmp_path / "af") as server:
        base = _clean_env(
            DUPGUARD_DATABASE_URL=server.db_url,
            DUPGUARD_AIRFLOW_API_URL=server.url,
            DUPGUARD_REMEDIATION="fail",
            DUPGUARD_REMEDIATION_BACKEND="api",
            DUPGUARD_LOG_FORMAT="json",
            DUPGUARD_LOG_LEVEL="debug",
            DUPGUARD_HTTP_PORT="0",
            DUPGUARD_STARTUP_LOOKBACK=f"{10 * 365}d",  # the scenario's runs were made long ago
        )
        # 1. A command that fails after printing something on stdout: one line, retried, no secret.
        failing = f"MARK={cmd_marker}; echo {stdout_marker}; echo 'no credentials' >&2; exit 4"
        done = subprocess.run(
            [DUPGUARD, "run", "--once"],
            env=base | {"DUPGUARD_AIRFLOW_TOKEN_COMMAND": failing},
            capture_output=True,
            text=True,
            timeout=120,
        )
        outputs["run --once, failing command"] = done.stdout + done.stderr
        assert "DUPGUARD_AIRFLOW_TOKEN_COMMAND failed (exit code 4: no credentials)" in done.stderr, done.stderr
        assert '"result": "failed"' in done.stderr and "Traceback" not in done.stderr
        assert not any(row.note for row in db_state(server.db_url).values())  # nothing written

        # 2. A command whose stdout is a token the server minted: the duplicates are failed through it.
        server.reset("race_asset_fanout")  # as Airflow made it again (the first run's attempt is in its past)
        good = f"MARK={cmd_marker} {sys.executable} {script} {server.url} {minted}"
        done = subprocess.run(
            [DUPGUARD, "run", "--once"],
            env=base | {"DUPGUARD_AIRFLOW_TOKEN_COMMAND": good},
            capture_output=True,
            text=True,
            timeout=120,
        )
        outputs["run --once, token command"] = done.stdout + done.stderr
        stopped = [row for row in db_state(server.db_url).values() if row.note and "dupguard stopped" in row.note]
        assert len(stopped) == 3 and all(row.state == "failed" for row in stopped), done.stderr

        # 3. check-config names the setting and hides its value.
        done = subprocess.run(
            [DUPGUARD, "check-config"],
            env=base | {"DUPGUARD_AIRFLOW_TOKEN_COMMAND": good},
            capture_output=True,
            text=True,
            timeout=60,
        )
        outputs["check-config"] = done.stdout + done.stderr
        assert "airflow_token_command: '***'" in outputs["check-config"], outputs["check-config"]
    tokens = minted.read_text().split()
    assert tokens  # the command ran and the server minted
    secrets = {"command text": cmd_marker, "failing stdout": stdout_marker} | {
        f"token {i}": token for i, token in enumerate(tokens)
    }
    leaks = {
        channel: [name for name, value in secrets.items() if value in text]
        for channel, text in outputs.items()
        if any(value in text for value in secrets.values())
    }
    assert leaks == {}, leaks

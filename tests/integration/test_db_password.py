"""A database password holding ``@ / : ? #`` connects, in the userinfo and in ``?password=``, and no part
of it shows in ``check-config``, ``config_loaded``, the exit-3 error or a warning.

A private PostgreSQL that checks the password (SCRAM for one role; the shared test server trusts
every local connection, so a wrong password would connect there too). Each form is written as libpq
accepts it: raw ``@ / : ? #`` in the query; in the userinfo only ``/`` is percent-encoded (libpq ends
the authority at the first ``/``) and the raw ``@`` is split at the last one.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy.engine import make_url

from tests.daemon_harness import wait_for
from tests.integration.test_run_process import DUPGUARD, events, free_port, metric, spawn
from tests.integration.test_secrets import _clean_env
from tests.pg import private_server

pytestmark = pytest.mark.integration
PASSWORD = "Mk9a@/:?#tail9"
PIECES = ("Mk9a", "tail9")  # what is left of the password on either side of a wrong split


@pytest.fixture
def scram_server() -> Iterator[tuple[str, str]]:
    """(superuser URL, host:port) of a private server where role ``dg_pw`` logs in with PASSWORD only."""
    with private_server() as server:
        admin, data = server.url, server.data
        conn = psycopg2.connect(admin)
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE ROLE dg_pw LOGIN SUPERUSER PASSWORD %s", (PASSWORD,))
            hba = data / "pg_hba.conf"
            hba.write_text("host all dg_pw 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
            cur.execute("SELECT pg_reload_conf()")
        conn.close()
        u = make_url(admin)
        where = f"{u.host}:{u.port}"
        wrong = f"host={u.host} port={u.port} dbname=postgres user=dg_pw password=wrong"
        wait_for(lambda: not _connects(wrong), timeout=15, what="password authentication")
        yield admin, where


def _connects(dsn: str) -> bool:
    try:
        psycopg2.connect(dsn).close()
    except psycopg2.OperationalError:
        return False
    return True


def _dupguard(*argv: str) -> subprocess.CompletedProcess[str]:
    env = _clean_env(DUPGUARD_LOG_FORMAT="json")
    return subprocess.run([DUPGUARD, *argv], env=env, capture_output=True, text=True, timeout=120)


def _shown(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


@pytest.mark.parametrize("form", ["userinfo", "query"])
def test_password_with_url_characters_connects_and_never_shows(
    scram_server: tuple[str, str],
    form: str,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    _, where = scram_server
    if form == "userinfo":
        url = f"postgresql://dg_pw:{PASSWORD.replace('/', '%2F')}@{where}/postgres"
        wrong = f"postgresql://dg_pw:x{PASSWORD.replace('/', '%2F')}@{where}/postgres"
    else:
        url = f"postgresql://dg_pw@{where}/postgres?password={PASSWORD}"
        wrong = f"postgresql://dg_pw@{where}/postgres?password=x{PASSWORD}"

    scan = _dupguard("scan", "--database-url", url, "--since", "1d")
    assert scan.returncode == 0, scan.stderr  # connected: the password was sent whole
    once = _dupguard("run", "--once", "--database-url", url)
    assert once.returncode == 0, once.stderr
    assert '"event": "config_loaded"' in once.stderr
    checked = _dupguard("check-config", "--database-url", url)
    assert checked.returncode == 0 and "database_url: 'postgresql+psycopg2://dg_pw" in checked.stdout, checked
    refused = _dupguard("scan", "--database-url", wrong)
    assert refused.returncode == 3 and "database postgresql+psycopg2://dg_pw" in refused.stderr, refused.stderr

    port, log = free_port(), tmp_path / "daemon.log"
    procs.append(spawn(url, log, DUPGUARD_HTTP_PORT=str(port), DUPGUARD_LOCK_DATABASE_URL=wrong))
    wait_for(lambda: metric(port, 'dupguard_state{state="lock_unavailable"}') == 1.0, timeout=30, what="lock refused")
    warned = [e for e in events(log) if e["level"] == "warning" and e.get("state") == "lock_unavailable"]
    assert warned and "dg_pw" in str(warned), log.read_text()

    outputs = {
        "scan": scan.stdout + scan.stderr,
        "run --once": once.stdout + once.stderr,
        "check-config": checked.stdout + checked.stderr,
        "exit-3 error": refused.stdout + refused.stderr,
        "daemon log": log.read_text(),
    }
    assert {channel: _shown(text) for channel, text in outputs.items() if _shown(text)} == {}

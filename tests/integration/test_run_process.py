"""`dupguard run` as real processes, as in a pod: --once on Airflow-made duplicates, SIGTERM, SIGKILL
failover between two replicas, a PostgreSQL restart under a running daemon, bad configuration."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from detector.app.cli import main
from tests.daemon_harness import wait_for
from tests.pg import Templates, ground_truth, private_server
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
DUPGUARD = str(Path(sys.executable).parent / "dupguard")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(url: str, log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_DATABASE_URL": url,
        "DUPGUARD_LOG_FORMAT": "json",
        "DUPGUARD_LEADER_CHECK_INTERVAL": "250ms",
    } | env  # fmt: skip
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen([DUPGUARD, "run", *args], env=full_env, stdout=out, stderr=subprocess.STDOUT)


def events(log: Path) -> list[dict]:  # type: ignore[type-arg]
    """The JSON events of a running daemon's log. Only complete lines: the daemon may be in the middle
    of writing the last one, and half a line is not a broken log."""
    text = log.read_text()
    out = []
    for line in text[: text.rfind("\n") + 1].splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def metric(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None


def test_once_reports_airflow_made_duplicate(pg_templates: Templates, tmp_path: Path) -> None:
    """`run --once` over a 3.1.2 race made by Airflow's scheduler logs one duplicate_detected for it."""
    url = pg_templates.clone("3.1.2", "race_asset")
    log = tmp_path / "once.log"
    p = spawn(url, log, "--once", DUPGUARD_STARTUP_LOOKBACK="3650d", DUPGUARD_HTTP_PORT="0")
    assert p.wait(60) == 0
    found = [e for e in events(log) if e["event"] == "duplicate_detected"]
    [truth] = ground_truth("3.1.2", "race_asset")["expected_groups"]
    assert len(found) == 1
    assert found[0]["dag_id"] == truth["dag_id"]
    assert found[0]["kept_run"] == truth["first_run_id"]
    assert found[0]["duplicate_runs"] == [r for r in truth["run_ids"] if r != truth["first_run_id"]]
    assert {"timestamp", "level", "event", "logger"} <= found[0].keys()


def test_sigterm_stops_within_grace_period(pg_templates: Templates, tmp_path: Path, procs: list) -> None:  # type: ignore[type-arg]
    """SIGTERM: the daemon releases its lock and exits 0 before the chart's 10 s grace period."""
    port = free_port()
    log = tmp_path / "term.log"
    p = spawn(pg_templates.clone("3.1.2"), log, DUPGUARD_HTTP_PORT=str(port))
    procs.append(p)
    wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leadership")
    sent = time.monotonic()
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    print(f"exited {time.monotonic() - sent:.2f}s after SIGTERM")
    names = [e["event"] for e in events(log)]
    assert "stopping" in names and "leader_released" in names and names[-1] == "stopped"


def test_sigkill_leader_standby_takes_over(pg_templates: Templates, tmp_path: Path, procs: list) -> None:  # type: ignore[type-arg]
    """Two replicas: one leads; SIGKILL it and the standby leads and handles the next duplicate."""
    url = pg_templates.clone("3.1.2")
    ports = [free_port(), free_port()]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = spawn(url, logs[0], DUPGUARD_HTTP_PORT=str(ports[0]))
    procs.append(a)
    wait_for(lambda: metric(ports[0], "dupguard_leader") == 1.0, what="a leads")
    b = spawn(url, logs[1], DUPGUARD_HTTP_PORT=str(ports[1]))
    procs.append(b)
    wait_for(lambda: status(ports[1], "/readyz") == 200, what="b ready")  # a healthy standby
    assert status(ports[1], "/livez") == 200
    assert metric(ports[1], "dupguard_leader") == 0.0
    a.kill()
    a.wait(10)
    took = wait_for(lambda: metric(ports[1], "dupguard_leader") == 1.0, timeout=20, what="b takes over")
    print(f"standby led {took:.2f}s after SIGKILL")
    writer = AirflowWriter(url)
    writer.duplicate_pair("consumer")
    writer.close()
    wait_for(lambda: any(e["event"] == "duplicate_detected" for e in events(logs[1])), what="b detects")


def test_postgres_restart_under_running_daemon(tmp_path: Path, procs: list) -> None:  # type: ignore[type-arg]
    """A private PostgreSQL restarts under the daemon: /livez stays 200, and a duplicate made after
    the restart is still detected."""
    with private_server("3.1.2") as server:
        port = free_port()
        log = tmp_path / "restart.log"
        p = spawn(server.url, log, DUPGUARD_HTTP_PORT=str(port))
        procs.append(p)
        wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leadership")
        server.restart()
        assert status(port, "/livez") == 200
        writer = AirflowWriter(server.url)
        writer.duplicate_pair("after_restart")
        writer.close()
        wait_for(lambda: any(e["event"] == "duplicate_detected" for e in events(log)), timeout=30, what="detect")
        assert p.poll() is None


def test_bad_configuration_lists_every_problem(capsys: pytest.CaptureFixture[str]) -> None:
    """Invalid settings: exit 2, every problem listed, no traceback."""
    code = main(["run", "--poll-interval", "fast", "--http-port", "70000", "--remediation", "fail"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--poll-interval" in err and "--http-port" in err and "DATABASE_URL" in err
    assert "Traceback" not in err

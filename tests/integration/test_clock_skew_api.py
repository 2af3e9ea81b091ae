"""A host clock that is off, for ``--source api``: ages of Airflow's timestamps are measured on the API server's clock
(the ``Date`` header of its answers), not on a host clock that is off. ``dupguard scan`` and ``run
--once`` run under libfaketime (Debian ``faketime``, installed by scripts/faketime.sh) against a real
Airflow 3.1.2 API server, whose clock is the true one; the runs' ages are set in Airflow's database.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest

from tests.airflow_server import AirflowServer, airflow_api_server, start_queued_runs
from tests.pg import Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

VERSION = "3.1.2"
FANOUT = "race_asset_fanout"  # 3 consumer DAGs, an exact duplicate pair each
DUPGUARD = str(Path(sys.executable).parent / "dupguard")
FAKETIME = shutil.which("faketime")
SKEWS = ["-10m", "+10m"]


@pytest.fixture(scope="module")
def af(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AirflowServer, str]]:
    """The server, and the one consumer DAG whose pair is 8 minutes old (the others' are 20)."""
    with airflow_api_server(VERSION, [FANOUT], pg_templates, tmp_path_factory.mktemp("af-clock")) as server:
        worker = threading.Thread(target=start_queued_runs, args=(VERSION, server.db_url))
        worker.start()  # Airflow serves a run's consumed events only once it started (apache/airflow#71360)
        worker.join()
        conn = psycopg2.connect(server.db_url)
        try:
            with conn, conn.cursor() as cur:
                cur.execute("SELECT min(dag_id) FROM dag_run WHERE run_type = 'asset_triggered'")
                recent = cur.fetchone()[0]
                # run_after, queued_at and start_date alike: a run started long after its run_after is
                # what the REST source's late sweep looks for (old queue rows), not what this test is about
                age = "now() - make_interval(mins => CASE WHEN dag_id = %s THEN 8 ELSE 20 END)"
                cur.execute(
                    f"UPDATE dag_run SET run_after = {age}, queued_at = {age}, start_date = {age} "
                    "WHERE run_type = 'asset_triggered'",
                    (recent, recent, recent),
                )
        finally:
            conn.close()
        yield server, recent


def _dupguard(server: AirflowServer, skew: str, *args: str) -> subprocess.CompletedProcess[str]:
    assert FAKETIME is not None, "faketime missing: scripts/faketime.sh installs it (scripts/test.sh runs it)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_SOURCE": "api",
        "DUPGUARD_AIRFLOW_API_URL": server.url,
        "DUPGUARD_AIRFLOW_USERNAME": "admin",
        "DUPGUARD_AIRFLOW_PASSWORD": "admin",
        "DUPGUARD_LOG_FORMAT": "json",
    }
    done = subprocess.run(
        [FAKETIME, "-f", skew, DUPGUARD, *args], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]  # 1: scan found something
    return done


@pytest.mark.parametrize("skew", SKEWS)
def test_scan_since_is_measured_on_the_api_servers_clock(af: tuple[AirflowServer, str], skew: str) -> None:
    """``--since 15m``: the pair queued 8 minutes ago is listed, the two queued 20 minutes ago are not,
    whichever way the host clock is off (10 minutes behind listed all three, 10 ahead none)."""
    server, recent = af
    doc: dict[str, Any] = json.loads(_dupguard(server, skew, "scan", "--since", "15m", "--format", "json").stdout)
    assert sorted({g["dag_id"] for g in doc["groups"]}) == [recent], doc["groups"]


@pytest.mark.parametrize("skew", SKEWS)
def test_the_startup_lookback_is_measured_on_the_api_servers_clock(af: tuple[AirflowServer, str], skew: str) -> None:
    """``run --once --startup-lookback 15m``: only the 8-minute-old pair is judged at start."""
    server, recent = af
    done = _dupguard(server, skew, "run", "--once", "--startup-lookback", "15m")
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    detected = sorted({e["dag_id"] for e in events if e["event"] == "duplicate_detected"})
    assert detected == [recent], detected

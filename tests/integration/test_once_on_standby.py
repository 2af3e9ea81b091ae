"""`run --once` while another replica leads: it checked nothing, says so and exits 4, not 0.

Two real processes on the test PostgreSQL: a daemon that holds the leader lock, and `run --once`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.daemon_harness import wait_for
from tests.integration.test_run_process import events, free_port, metric, spawn
from tests.pg import Templates

pytestmark = pytest.mark.integration


def test_once_while_another_replica_leads_exits_4(pg_templates: Templates, tmp_path: Path) -> None:
    url = pg_templates.clone("3.1.2", "race_asset")  # a duplicate is there: exit 0 would hide it
    port = free_port()
    leader = spawn(url, tmp_path / "leader.log", DUPGUARD_HTTP_PORT=str(port))
    try:
        wait_for(lambda: metric(port, "dupguard_leader") == 1.0, timeout=90, what="the daemon leads")
        log = tmp_path / "once.log"
        once = spawn(url, log, "--once", DUPGUARD_STARTUP_LOOKBACK="3650d", DUPGUARD_HTTP_PORT="0")
        assert once.wait(60) == 4
        logged = events(log)
        refused = [e for e in logged if e["event"] == "not_leader"]
        assert len(refused) == 1 and "nothing checked" in refused[0]["detail"]
        assert not any(e["event"] in ("duplicate_detected", "leader_acquired") for e in logged)
    finally:
        leader.terminate()
        leader.wait(10)

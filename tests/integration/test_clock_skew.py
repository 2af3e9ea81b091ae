"""dupguard on a host whose clock is 10 minutes off the database's: ``dupguard run
--once`` under libfaketime (Debian ``faketime``, installed by scripts/faketime.sh) against the real
test PostgreSQL. Ages of Airflow's timestamps are measured on the database's clock, so the skew
changes nothing: the start-up look-back re-examines exactly the runs queued within it, and a split
partition key is alerted once it lasted ``--split-grace`` by the clock that wrote it.

Before the fix the host clock was used: 10 minutes behind re-alerted groups older than the look-back
and held a split back for 10 minutes; 10 minutes ahead skipped groups inside the look-back and
alerted a split the moment it formed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from datetime import timedelta
from typing import Any

import psycopg2
import pytest

from tests.integration.test_run_process import DUPGUARD
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
SKEWS = ["-10m", "+10m"]
FAKETIME = shutil.which("faketime")


def _dupguard(url: str, skew: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``dupguard *args`` on a host clock ``skew`` off."""
    assert FAKETIME is not None, "faketime missing: scripts/faketime.sh installs it (scripts/test.sh runs it)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")} | {
        "DUPGUARD_DATABASE_URL": url,
        "DUPGUARD_LOG_FORMAT": "json",
    }  # not FAKETIME_DONT_FAKE_MONOTONIC: with it, libfaketime 0.9.10 fails Python's time.sleep (EINVAL)
    done = subprocess.run(
        [FAKETIME, "-f", skew, DUPGUARD, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]  # 1: scan found something
    return done


def _run_once(url: str, skew: str, *args: str) -> list[dict[str, Any]]:
    """``dupguard run --once``: its JSON log events."""
    done = _dupguard(url, skew, "run", "--once", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]  # logs: stderr


def _scan(url: str, skew: str, *args: str) -> dict[str, Any]:
    """``dupguard scan --format json``: its document."""
    doc: dict[str, Any] = json.loads(_dupguard(url, skew, "scan", "--format", "json", *args).stdout)
    return doc


def _shift(url: str, sql: str, *params: Any) -> None:
    conn = psycopg2.connect(url)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
    finally:
        conn.close()


@pytest.mark.parametrize("skew", SKEWS)
def test_the_startup_lookback_is_measured_on_the_database_clock(skew: str, pg_templates: Templates) -> None:
    """Look-back 15 min: six groups queued 20 minutes ago (by the database's clock) are not examined
    again at start, one queued 8 minutes ago is, whichever way the host clock is off."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    old = [writer.duplicate_pair(f"old_{i}", gap=timedelta(0))[1] for i in range(6)]
    recent = writer.duplicate_pair("recent", gap=timedelta(0))[1]
    writer.close()
    ages = "CASE WHEN id >= %s THEN 8 ELSE 20 END"
    _shift(url, f"UPDATE dag_run SET queued_at = queued_at - make_interval(mins => {ages}), "
           f"run_after = run_after - make_interval(mins => {ages})", recent.id - 1, recent.id - 1)  # fmt: skip
    events = _run_once(url, skew, "--startup-lookback", "15m")
    detected = [e for e in events if e["event"] == "duplicate_detected"]
    assert [e["dag_id"] for e in detected] == ["recent"], [e["dag_id"] for e in detected]
    assert old[0].id < recent.id
    # scan --since counts back from the database's clock too
    assert [g["dag_id"] for g in _scan(url, skew, "--since", "15m")["groups"]] == ["recent"]


@pytest.mark.parametrize("skew", SKEWS)
def test_split_grace_is_measured_on_the_database_clock(skew: str, pg_templates: Templates) -> None:
    """Two split keys (Airflow 3.3.2's own split, and a copy of it under another key): the one that
    formed 5 minutes ago is alerted, the one that formed just now is not (grace 60 s)."""
    url = pg_templates.clone("3.3.2", "split_and")
    _shift(
        url,
        "INSERT INTO asset_partition_dag_run (id, target_dag_id, created_dag_run_id, partition_key, partition_date, "
        "rollup_fingerprint, created_at, updated_at) SELECT id + 2, target_dag_id, NULL, 'fresh', partition_date, "
        "rollup_fingerprint, now(), now() FROM asset_partition_dag_run WHERE id IN (1, 2); "
        "INSERT INTO partitioned_asset_key_log (id, asset_id, asset_event_id, asset_partition_dag_run_id, "
        "source_partition_key, target_dag_id, target_partition_key, created_at) SELECT id + 2, asset_id, "
        "asset_event_id, asset_partition_dag_run_id + 2, 'fresh', target_dag_id, 'fresh', now() "
        "FROM partitioned_asset_key_log WHERE id IN (1, 2); "
        "UPDATE asset_partition_dag_run SET created_at = now() - interval '5 minutes' WHERE id IN (1, 2)",
    )
    events = _run_once(url, skew, "--split-grace", "60s")
    alerted = [e["partition_key"] for e in events if e["event"] == "split_partition_detected"]
    assert alerted == ["2026-11-30T05:00:00"], alerted
    scanned = _scan(url, skew, "--split-grace", "60s")["split_partitions"]
    assert [s["partition_key"] for s in scanned] == ["2026-11-30T05:00:00"], scanned

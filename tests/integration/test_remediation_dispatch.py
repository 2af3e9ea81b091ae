"""Remediation never blocks detection, and failures are retried. Real PostgreSQL with the
real 3.1.2 schema; a real Airflow 3.1.2 API server behind a proxy that can play "down"; for the
cadence test an HTTP server that accepts connections and never answers (a hanging API).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from datetime import timedelta
from typing import Any

import psycopg2
import pytest

from detector.core.ports import Result
from tests.airflow_server import AirflowServer, CountingProxy, ServerPool, db_state
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, ground_truth
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration

FANOUT = "race_asset_fanout"  # 3 consumer DAGs, a duplicate pair each, all runs QUEUED, nothing started
LONG_AGO = timedelta(days=3650)
FAST_RETRIES = {"retry_backoff": 0.2, "max_retry_backoff": 1.0}


class HangingServer:
    """Accepts TCP connections and never answers: an API server that hangs."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._thread.join(timeout=5)
        self.sock.close()
        for conn in self.held:
            conn.close()


def _gauge(d: Running, name: str) -> float:
    value = d.metrics.registry.get_sample_value(name)
    return -1.0 if value is None else value


def test_detection_keeps_its_cadence_while_the_api_hangs(pg_templates: Templates, daemons: list[Running]) -> None:
    """Every remediation hangs on the API (30 s timeout): eight duplicates committed one after another
    are each detected while not one remediation has come back; the four workers hold four, the queue
    (a metric) the other four."""
    url = pg_templates.clone("3.1.2")
    hanging = HangingServer()
    try:
        d = start_daemon(
            url,
            real_remediation=True,
            remediation="fail",
            remediation_backend="api",  # the API is what hangs (auto would write to the database)
            airflow_api_url=hanging.url,
            airflow_token="static-token",  # no token request: the PATCH itself hangs
            airflow_timeout=timedelta(seconds=30),
            # a lease longer than the timeout, so each PATCH hangs its whole 30 s (a write is cut at the
            # end of the lease: docs/explanation/remediation.md, Leadership and fencing); one replica: no takeover wait
            leader_check_interval=timedelta(seconds=20),
            takeover_wait=timedelta(0),
        )
        daemons.append(d)
        wait_for(d.is_leader, what="leadership")
        writer = AirflowWriter(url)
        for n in range(1, 9):
            writer.duplicate_pair(f"consumer_{n}", gap=timedelta(0))
            wait_for(lambda n=n: len(d.alerter.detected()) == n, what=f"duplicate {n} detected")
        wait_for(lambda: _gauge(d, "dupguard_remediation_queue_depth") == 4, what="four remediations queued")
        assert d.alerter.results() == {}  # every remediation is still hanging
        assert len(hanging.held) >= 4
        writer.close()
    finally:
        hanging.close()


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.1.2", [FANOUT])


def _group(dag_id: str) -> tuple[str, str]:
    group = next(g for g in ground_truth("3.1.2", FANOUT)["expected_groups"] if g["dag_id"] == dag_id)
    [dup] = [r for r in group["run_ids"] if r != group["first_run_id"]]
    return group["first_run_id"], dup


def _settings(proxy: CountingProxy, dag_id: str, **more: Any) -> dict[str, Any]:
    return {
        "remediation": "fail",
        "remediation_backend": "api",
        "airflow_api_url": proxy.url,
        "airflow_username": "admin",
        "airflow_password": "admin",
        "dags": (dag_id,),
        "startup_lookback": LONG_AGO,
        "backend_options": {"attempts": 1},
        "dispatch_options": FAST_RETRIES,
        # a lease (3 s) longer than a PATCH under load: a write is cut at the end of the lease; no
        # predecessor's writes to wait for (the takeover wait has its own tests: test_fencing.py)
        "leader_check_interval": timedelta(seconds=1),
        "takeover_wait": timedelta(0),
    } | more


@pytest.mark.airflow
@pytest.mark.parametrize("durable", [False, True], ids=["memory-ledger", "durable-ledger"])
def test_queued_duplicate_is_stopped_when_the_api_comes_back(
    durable: bool, af312: AirflowServer, daemons: list[Running]
) -> None:
    """The API is down when the duplicate (QUEUED, as behind max_active_runs=1) is detected: the
    failure is reported, retried with back-off, and once the API answers again the duplicate is
    failed with its note; the kept run is untouched."""
    url = af312.reset(FANOUT)
    kept, dup = _group("orders_consumer_1")
    before = db_state(url)
    with CountingProxy(af312.port) as proxy:
        proxy.outage = 503
        d = start_daemon(url, real_remediation=True, durable=durable, **_settings(proxy, "orders_consumer_1"))
        daemons.append(d)
        wait_for(lambda: Result.FAILED in d.alerter.results().get(dup, []), what="the first failure reported")
        wait_for(lambda: sum(proxy.requests.values()) >= 3, what="retries while the API is down")
        assert db_state(url) == before
        proxy.outage = 0  # the API is back
        wait_for(lambda: Result.DONE in d.alerter.results().get(dup, []), what="the duplicate stopped")
    after = db_state(url)
    assert after[dup].state == "failed" and kept in (after[dup].note or "")
    assert after[kept] == before[kept]
    results = d.alerter.results()[dup]
    assert set(results[:-1]) == {Result.FAILED} and results[-1] is Result.DONE
    if durable:
        assert d.daemon.parts.ledger.pending() == []


@pytest.mark.airflow
def test_a_new_leader_picks_up_an_unfinished_remediation(af312: AirflowServer, daemons: list[Running]) -> None:
    """Durable ledger: the leader's remediation keeps failing (API down) and the leader goes away; the
    new leader finds the pending remediation, re-judges the group and stops the duplicate. The claim
    stays with the first leader (exactly once); the kept run is untouched."""
    url = af312.reset(FANOUT)
    kept, dup = _group("orders_consumer_2")
    before = db_state(url)
    with CountingProxy(af312.port) as down, CountingProxy(af312.port) as up:
        down.outage = 503
        first = start_daemon(url, real_remediation=True, durable=True, **_settings(down, "orders_consumer_2"))
        daemons.append(first)
        wait_for(lambda: Result.FAILED in first.alerter.results().get(dup, []), what="the first failure")
        assert [p.run_id for p in first.daemon.parts.ledger.pending()] == [dup]
        first.stop()
        daemons.remove(first)
        second = start_daemon(url, real_remediation=True, durable=True, **_settings(up, "orders_consumer_2"))
        daemons.append(second)
        wait_for(lambda: Result.DONE in second.alerter.results().get(dup, []), what="the new leader stopped it")
    after = db_state(url)
    assert after[dup].state == "failed" and kept in (after[dup].note or "")
    assert after[kept] == before[kept]
    assert second.alerter.detected() == []  # the group was already announced and claimed
    assert second.daemon.parts.ledger.pending() == []
    conn = psycopg2.connect(url)
    with conn.cursor() as cur:
        cur.execute("SELECT owner FROM dupguard.claims WHERE subject = %s", (f"action:{dup}",))
        assert len(cur.fetchall()) == 1
    conn.close()


def test_db_backend_failure_is_retried_until_the_lock_is_free(pg_templates: Templates, daemons: list[Running]) -> None:
    """db backend: another transaction holds the duplicate's dag_run row (as a long scheduler
    transaction could), so the remediation's lock_timeout fails it; it is retried with back-off and,
    once the row is free, the duplicate is failed with its note; the kept run is untouched."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    kept, dup = writer.duplicate_pair("consumer", gap=timedelta(0))
    holder = psycopg2.connect(url)
    with holder.cursor() as cur:
        cur.execute("SELECT id FROM dag_run WHERE run_id = %s FOR UPDATE", (dup.run_id,))
    before = db_state(url)
    d = start_daemon(
        url,
        real_remediation=True,
        remediation="fail",
        remediation_backend="db",
        backend_options={"lock_timeout_ms": 200},
        dispatch_options=FAST_RETRIES,
    )
    daemons.append(d)
    try:
        wait_for(lambda: Result.FAILED in d.alerter.results().get(dup.run_id, []), what="the first failure")
        assert db_state(url) == before
    finally:
        holder.rollback()
        holder.close()
    wait_for(lambda: Result.DONE in d.alerter.results().get(dup.run_id, []), what="the duplicate stopped")
    after = db_state(url)
    assert after[dup.run_id].state == "failed" and kept.run_id in (after[dup.run_id].note or "")
    assert after[kept.run_id] == before[kept.run_id]
    writer.close()

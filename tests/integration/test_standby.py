"""Hot standbys and reader endpoints, on a real streaming replica of the test server
(PostgreSQL 15, ``pg_basebackup -R``, started and stopped here: tests/pg_replica.py).

Advisory locks work on a hot standby, where they exclude only the replicas on that standby: a
replica pointed at a reader endpoint took its own lock and led beside the real leader. Its re-read
before a write came from a lagging copy too. Now a connection to a server in recovery is never used
for the lock nor for the re-read before a write, the state says so, and `scan` / `run` say what they
read."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.cli import main
from detector.app.leader import LOCK_ON_STANDBY, AdvisoryLock
from detector.app.run import run_daemon
from detector.app.scan import scan
from detector.app.status import State, evaluate
from detector.app.wiring import build_remediator
from detector.config import SETTINGS_BY_NAME, Config
from detector.core.plan import Mode, Outcome, plan
from detector.core.ports import Result
from detector.metadb import leader_lock
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import AirflowServer, ServerPool, db_state, start_task, warm_execution_api
from tests.integration.test_run_process import events, free_port, metric, spawn
from tests.pg import Templates
from tests.pg_replica import Replica

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)
KEY = int(SETTINGS_BY_NAME["lock_key"].default)
SCENARIO = "race_asset_fanout"  # three consumer DAGs, a duplicate pair each, nothing started


@pytest.fixture
def primary_url(pg_templates: Templates, replica: Replica) -> str:
    url = pg_templates.clone("3.1.2", SCENARIO)
    replica.wait_caught_up()
    return url


def _lock(url: str, mode: str = "auto") -> AdvisoryLock:
    return AdvisoryLock(make_engine(parse_url(url), pool_size=1), KEY, mode=mode, lease=LEASE)


@pytest.mark.parametrize("mode", ["auto", "session", "transaction"])
def test_the_lock_is_never_taken_on_a_hot_standby(primary_url: str, replica: Replica, mode: str) -> None:
    """A replica whose lock URL reaches the standby never leads, in any lock mode, while a replica on the
    primary does; its problem names the setting, and its state is lock_on_standby. (Before: both led,
    one lock per server.)"""
    now = datetime.now(UTC)
    on_standby, on_primary = _lock(replica.url(primary_url), mode), _lock(primary_url, mode)
    try:
        assert on_primary.ensure(now) is True
        for _ in range(3):
            assert on_standby.ensure(now) is False
            assert on_primary.ensure(now) is True
        problem = on_standby.problem
        assert problem is not None and problem.code == LOCK_ON_STANDBY
        assert "DUPGUARD_LOCK_DATABASE_URL" in problem.reason and "pg_is_in_recovery" in problem.reason
        status = evaluate(db_error=None, leader=False, poll_error=None, lock=problem)
        assert status.state is State.LOCK_ON_STANDBY and not status.up
        on_primary.release()
        assert on_standby.ensure(now) is False, "not even with the lock free on the primary"
    finally:
        on_standby.release()
        on_primary.release()


def test_a_leader_whose_server_reports_recovery_at_a_heartbeat_stops_leading(
    primary_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The heartbeat asks pg_is_in_recovery() too: a lock server that answers true (a primary replaced by
    a standby behind a stable URL; a live server cannot be demoted, so the answer is patched here after
    a real acquisition) ends leadership at once and frees the lock."""
    lock = _lock(primary_url)
    try:
        assert lock.ensure(datetime.now(UTC)) is True
        monkeypatch.setattr(leader_lock, "in_recovery", lambda conn: True)
        monkeypatch.setattr(
            leader_lock, "session_lock_status", lambda conn, key, pid: (True, True, True)
        )  # the heartbeat
        assert lock.ensure(datetime.now(UTC)) is False
        assert not lock.is_leader(datetime.now(UTC))
        assert lock.problem is not None and lock.problem.code == LOCK_ON_STANDBY
    finally:
        lock.release()


def test_a_daemon_on_a_reader_endpoint_says_so_and_never_leads(
    primary_url: str,
    replica: Replica,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """`dupguard run` with DUPGUARD_DATABASE_URL at the standby: one warning naming that setting with the
    replay lag, the state lock_on_standby (gauge, /readyz) with a reason naming the lock setting, never
    the leader gauge. (Before: it led.)"""
    port, log = free_port(), tmp_path / "standby.log"
    procs.append(spawn(replica.url(primary_url), log, DUPGUARD_HTTP_PORT=str(port), DUPGUARD_LEDGER="off"))
    state = 'dupguard_state{state="lock_on_standby"}'
    deadline = time.monotonic() + 60
    while metric(port, state) != 1.0:
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.1)
    assert metric(port, "dupguard_leader") == 0.0
    assert metric(port, "dupguard_up") == 0.0
    server = [e for e in events(log) if e["event"] == "database_server"]
    assert len(server) == 1 and server[0]["level"] == "warning"
    assert server[0]["role"] == "standby" and server[0]["setting"] == "DUPGUARD_DATABASE_URL"
    assert isinstance(server[0]["replay_lag_seconds"], float)
    changed = [e for e in events(log) if e["event"] == "status_changed" and e["state"] == "lock_on_standby"]
    assert len(changed) == 1 and "DUPGUARD_LOCK_DATABASE_URL" in changed[0]["reason"]
    assert not [e for e in events(log) if e["event"] == "leader_acquired"]


def test_scan_says_which_server_it_read(primary_url: str, replica: Replica, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON: ``server`` is primary with a null lag on the primary, standby with its replay lag on the
    replica (the same groups: it has caught up); the table's first line says it too."""
    docs = {}
    for name, url in (("primary", primary_url), ("standby", replica.url(primary_url))):
        assert main(["scan", "--database-url", url, "--format", "json"]) == 1  # duplicates found
        docs[name] = json.loads(capsys.readouterr().out)
    assert docs["primary"]["server"] == {"role": "primary", "replay_lag_seconds": None}
    assert docs["standby"]["server"]["role"] == "standby"
    assert isinstance(docs["standby"]["server"]["replay_lag_seconds"], float)
    assert docs["standby"]["groups"] == docs["primary"]["groups"]
    assert main(["scan", "--database-url", replica.url(primary_url)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert "read from the standby (in recovery, replay lag" in first
    report = scan(open_airflow_db(make_engine(parse_url(primary_url))), now=datetime.now(UTC))
    assert report.server is not None and not report.server.standby


def _once(capsys: pytest.CaptureFixture[str], url: str) -> tuple[int, list[dict]]:  # type: ignore[type-arg]
    env = {"DUPGUARD_DATABASE_URL": url, "DUPGUARD_HTTP_PORT": "0", "DUPGUARD_LOG_FORMAT": "json"}
    code = run_daemon({}, env=env | {"DUPGUARD_LEDGER": "off"}, once=True, install_signals=False)
    err = capsys.readouterr().err  # the JSON log
    return code, [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_run_once_says_which_server_it_read(
    primary_url: str, replica: Replica, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --once` logs the server it read: primary (info) or standby (a warning with the replay lag,
    naming DUPGUARD_DATABASE_URL); on the standby it does nothing, exits 4 and says why (lock_on_standby),
    not "another replica holds the leader lock"."""
    code, logged = _once(capsys, primary_url)
    assert code == 0
    assert [(e["level"], e["role"]) for e in logged if e["event"] == "database_server"] == [("info", "primary")]
    assert any(e["event"] == "leader_acquired" for e in logged)
    code, logged = _once(capsys, replica.url(primary_url))
    assert code == 4  # nothing checked
    server = [e for e in logged if e["event"] == "database_server"]
    assert len(server) == 1 and server[0]["level"] == "warning" and server[0]["role"] == "standby"
    assert server[0]["setting"] == "DUPGUARD_DATABASE_URL"
    refused = [e for e in logged if e["event"] == "not_leader"]
    assert len(refused) == 1 and refused[0]["level"] == "warning" and refused[0]["problem"] == LOCK_ON_STANDBY
    assert "DUPGUARD_LOCK_DATABASE_URL" in refused[0]["detail"]
    assert not any(e["event"] in ("leader_acquired", "watching") for e in logged)


# --- the re-read before a write: a real Airflow 3.1.2 API server on the primary --------------------


@pytest.fixture(scope="module")
def af312(airflow_servers: ServerPool) -> AirflowServer:
    return airflow_servers.get("3.1.2", [SCENARIO])


@pytest.fixture
def paused(af312: AirflowServer, replica: Replica) -> Iterator[str]:
    """The live database, replayed on the standby and then frozen there (``pg_wal_replay_pause``): the
    standby lags the primary by everything written from now on. Yields the standby's URL."""
    af312.reset(SCENARIO)
    replica.wait_caught_up()
    standby = replica.url(af312.db_url)
    replica.execute("SELECT pg_wal_replay_pause()")
    try:
        yield standby
    finally:
        replica.execute("SELECT pg_wal_replay_resume()")


@pytest.mark.airflow
def test_the_reread_before_a_write_never_comes_from_a_standby(af312: AirflowServer, paused: str) -> None:
    """DUPGUARD_DATABASE_URL at a standby that lags: the duplicate's task started on the primary but the
    standby still shows it queued. The api backend's re-read refuses the standby: the attempt fails
    (retryable, naming the setting) and Airflow's rows are untouched. (Before: the stale re-read said
    "not started" and the API failed a run whose task was running.)"""
    engine = make_engine(parse_url(paused))
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        actions = plan(scan(db, now=now).findings, Mode.FAIL, now=now)
        action = next(a for a in actions if a.outcome is Outcome.REMEDIATE)
        warm_execution_api(af312)
        start_task(af312, action.dag_id, action.run.run_id, "extract")
        before = db_state(af312.db_url)
        assert before[action.run.run_id].tasks["extract"][0] == "running"
        settings = {
            "database_url": paused,
            "remediation": "fail",
            "remediation_backend": "api",
            "airflow_api_url": af312.url,
            "airflow_username": "admin",
            "airflow_password": "admin",
        }
        remediator = build_remediator(Config.of(**settings), engine, db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        try:
            result = remediator.execute(action)
        finally:
            remediator.close()
        assert result.result is Result.FAILED and result.retryable
        assert "hot standby" in result.detail and "DUPGUARD_DATABASE_URL" in result.detail
        assert db_state(af312.db_url) == before
    finally:
        engine.dispose()

"""A state in which dupguard cannot detect or cannot act is never silent. Real
`dupguard run` processes on real PostgreSQL (a private server where backends are stopped with
SIGSTOP: a stopped backend would block every other test's DROP DATABASE on the shared one).

Each fault must show, within seconds, as /readyz 503 with the state in its body, `dupguard_up 0`,
`dupguard_state{state=...} 1`, and one warning log line naming the state."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from detector.app.cli import main
from detector.app.ledger import ledger_exists
from tests.daemon_harness import wait_for
from tests.integration.test_run_process import events, free_port, metric, spawn, status
from tests.pg import Templates, execute_admin, private_server
from tests.pgbouncer import pgbouncer
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration


def state_metric(port: int, state: str) -> float | None:
    return metric(port, f'dupguard_state{{state="{state}"}}')


def body(port: int, path: str) -> str:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return str(resp.read().decode())
    except urllib.error.HTTPError as exc:
        return str(exc.read().decode())


def assert_down(port: int, log: Path, state: str, timeout: float = 15.0) -> None:
    """The fault is visible everywhere it must be: probe, metrics, one warning line."""
    wait_for(lambda: status(port, "/readyz") == 503 and state_metric(port, state) == 1.0, timeout, f"{state} shown")
    assert metric(port, "dupguard_up") == 0.0
    assert state in body(port, "/readyz")
    assert status(port, "/livez") == 200  # the sidecar's only probe: never restart-looped by a DB fault
    warned = [e for e in events(log) if e["level"] == "warning" and e.get("state") == state]
    assert len(warned) == 1, warned


def test_failing_lock_connection_is_visible(pg_templates: Templates, tmp_path: Path, procs: list) -> None:  # type: ignore[type-arg]
    """A leader-lock URL that cannot log in (unknown role, the same failure as a wrong password)."""
    url = pg_templates.clone("3.1.2")
    bad = make_url(url).set(username="no_such_role", password="s3cret-marker").render_as_string(hide_password=False)
    port, log = free_port(), tmp_path / "lock.log"
    procs.append(spawn(url, log, DUPGUARD_HTTP_PORT=str(port), DUPGUARD_LOCK_DATABASE_URL=bad))
    assert_down(port, log, "lock_unavailable")
    assert metric(port, "dupguard_leader") == 0.0
    assert "s3cret-marker" not in log.read_text() and "s3cret-marker" not in body(port, "/readyz")


def test_lock_key_outside_bigint_is_rejected() -> None:
    """PostgreSQL advisory lock keys are bigint: a larger key (or Airflow's own 1 and 2) is a
    configuration error naming the setting, before anything connects."""
    from detector.config import load
    from detector.errors import ConfigError

    for key in (str(2**63), str(-(2**63) - 1), "1", "2"):
        with pytest.raises(ConfigError) as err:
            load({"database_url": "postgresql://u@h/db", "lock_key": key}, env={})
        assert "--lock-key" in str(err.value), key
    assert load({"database_url": "postgresql://u@h/db", "lock_key": str(2**63 - 1)}, env={}).lock_key == 2**63 - 1


@pytest.fixture
def readonly_role(pg_templates: Templates) -> Iterator[tuple[str, str]]:
    """A clone whose ledger an admin created, and a role with the deploy guide's read-only grants."""
    url = pg_templates.clone("3.1.2")
    role = f"ro_{uuid.uuid4().hex[:8]}"
    dbname = make_url(url).database
    assert main(["init-db", "--database-url", url]) == 0
    execute_admin(f'CREATE ROLE "{role}" LOGIN')
    execute_admin(
        f'GRANT CONNECT ON DATABASE "{dbname}" TO "{role}"; GRANT USAGE ON SCHEMA public TO "{role}"; '
        "GRANT SELECT ON dag_run, task_instance, dagrun_asset_event, asset_event, asset, job, alembic_version "
        f'TO "{role}";',
        dbname=dbname,
    )
    yield url, make_url(url).set(username=role).render_as_string(hide_password=False)
    execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)
    execute_admin(f'DROP ROLE "{role}"')


def test_ledger_the_role_cannot_use_is_visible(
    readonly_role: tuple[str, str],
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """Schema dupguard made by an admin, daemon on a read-only role: the ledger cannot record (permission
    denied). Detection goes on, but the replica is not ready and says why, once."""
    _, ro_url = readonly_role
    port, log = free_port(), tmp_path / "ro.log"
    procs.append(spawn(ro_url, log, DUPGUARD_HTTP_PORT=str(port)))
    assert_down(port, log, "ledger_fault")
    assert "permission denied" in body(port, "/readyz")


def test_ledger_dropped_under_running_daemon_is_visible(
    pg_templates: Templates,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """`init-db --drop` under a running daemon: a warning names the missing table, and the leader, whose
    role may create it, re-creates the ledger and is ready again."""
    url = pg_templates.clone("3.1.2")
    assert main(["init-db", "--database-url", url]) == 0
    port, log = free_port(), tmp_path / "drop.log"
    procs.append(spawn(url, log, DUPGUARD_HTTP_PORT=str(port)))
    wait_for(lambda: status(port, "/readyz") == 200 and metric(port, "dupguard_leader") == 1.0, what="leading")
    assert main(["init-db", "--drop", "--database-url", url]) == 0
    writer = AirflowWriter(url)
    writer.ordinary("consumer")
    writer.close()
    wait_for(lambda: any(e["event"] == "ledger_repaired" for e in events(log)), what="the ledger repaired")
    faults = [e for e in events(log) if e["event"] == "ledger_fault"]
    assert faults and all(e["level"] == "warning" and e["kind"] == "missing" for e in faults), faults
    assert "init-db" in faults[0]["repair"]
    wait_for(lambda: status(port, "/readyz") == 200, what="ready again")
    engine = create_engine(url)
    try:
        assert ledger_exists(engine)
    finally:
        engine.dispose()


def test_run_committed_after_gap_grace_is_found_and_reported(
    pg_templates: Templates,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """A duplicate whose transaction commits long after its id was taken (after --gap-grace, while a
    later id is already visible) is still detected, with a warning and a metric."""
    url = pg_templates.clone("3.1.2")
    port, log = free_port(), tmp_path / "late.log"
    procs.append(spawn(url, log, DUPGUARD_HTTP_PORT=str(port), DUPGUARD_GAP_GRACE="1s"))
    wait_for(lambda: metric(port, "dupguard_leader") == 1.0, what="leading")
    wait_for(lambda: any(e["event"] == "watching" for e in events(log)), what="watching")
    a, b = AirflowWriter(url), AirflowWriter(url, seed=2)
    try:
        run_after = datetime.now(UTC)
        event = a.event(run_after - timedelta(milliseconds=5))
        first = a.run("consumer", run_after, [event], job=1)
        late_id, _ = b.begin_run("consumer", run_after, [event], job=2)  # id taken, not committed
        later = a.ordinary("other")  # a higher id becomes visible: late_id is a gap
        assert first.id < late_id < later.id
        wait_for(lambda: (metric(port, "dupguard_poll_duration_seconds_count") or 0) > 0, what="polls")
        import time

        time.sleep(3.0)  # three times the grace: the gap has expired
        b.conn.commit()
    finally:
        a.close()
        b.close()
    wait_for(lambda: any(e["event"] == "duplicate_detected" for e in events(log)), timeout=15, what="late duplicate")
    [found] = [e for e in events(log) if e["event"] == "duplicate_detected"]
    assert found["kept_run"] == first.run_id
    [warned] = [e for e in events(log) if e["event"] == "late_run_found"]
    assert warned["level"] == "warning" and warned["run_ids"] == [late_id]
    assert metric(port, "dupguard_late_runs_total") == 1.0


@pytest.fixture
def private_pg() -> Iterator[str]:
    """A PostgreSQL of this test's own, with the 3.1.2 schema: its backends may be stopped."""
    with private_server("3.1.2") as server:
        yield server.url


def _dupguard_backends(admin: str) -> list[int]:
    conn = psycopg2.connect(admin)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        pids = [int(r[0]) for r in cur.fetchall()]
    conn.close()
    return pids


@pytest.mark.parametrize("via", ["direct", "pgbouncer"])
def test_stalled_backends_are_visible_and_calls_time_out(
    private_pg: str,
    via: str,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """Every backend serving the daemon (lock, polls) is stopped with SIGSTOP, directly or behind
    PgBouncer's transaction pooling: the heartbeat and the poll time out instead of hanging,
    `dupguard_leader` drops to 0, and the replica reports that the lock's holder is unresponsive."""
    port, log = free_port(), tmp_path / "stall.log"
    with pgbouncer(private_pg, "transaction") if via == "pgbouncer" else _same(private_pg) as url:
        env = {"DUPGUARD_HTTP_PORT": str(port), "DUPGUARD_DB_TIMEOUT": "1s"}
        procs.append(spawn(url, log, **env))
        wait_for(lambda: status(port, "/readyz") == 200 and metric(port, "dupguard_leader") == 1.0, what="leading")
        stopped = _dupguard_backends(private_pg)
        assert stopped
        try:
            for pid in stopped:
                _signal(pid, signal.SIGSTOP)
            wait_for(lambda: metric(port, "dupguard_leader") == 0.0, timeout=10, what="leader gauge drops")
            assert_down(port, log, "leader_unresponsive", timeout=20)
            # A poll's deadline is DUPGUARD_DB_TIMEOUT (1s), the heartbeat's that bounded by its lease: which
            # call reports first depends on whether a poll was in flight when the backends stopped.
            said = (str(e.get("reason", e.get("error", ""))) for e in events(log))
            timed_out = [m for m in said if re.search(r"no answer within [0-9.]+s", m)]
            assert timed_out, "no database call reported its timeout"
        finally:
            for pid in stopped:
                _signal(pid, signal.SIGCONT)


class _same:
    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        return None


def _server_processes(data: Path) -> list[int]:
    """The postmaster of a private server and every process it started."""
    postmaster = int((data / "postmaster.pid").read_text().split()[0])
    children = subprocess.run(["ps", "-o", "pid=", "--ppid", str(postmaster)], capture_output=True, text=True)
    return [postmaster, *(int(p) for p in children.stdout.split())]


def _signal(pid: int, sig: signal.Signals) -> None:
    """A backend listed by ``ps`` may have exited since (a short-lived connection): nothing to stop or
    wake then (CI of 2026-12-01 failed on ProcessLookupError)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


@pytest.mark.parametrize("db_timeout", ["1s", "5s"], ids=["timeout-within-lease", "default-timeout-past-lease"])
def test_a_stopped_server_never_shows_as_a_live_leader_elsewhere(
    db_timeout: str,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """The whole server is stopped (SIGSTOP: postmaster and backends) under a single leading replica.
    While the lock's heartbeat has no answer (past its 3 s lease with the default 5 s deadline), and
    after it timed out, /readyz says what is known (the lock check failed, or the database does not
    answer); it said "standby: another replica holds the leader lock" for seconds (no such replica)."""
    port, log = free_port(), tmp_path / "stopped.log"
    with private_server("3.1.2") as server:
        admin, data = server.url, server.data
        procs.append(spawn(admin, log, DUPGUARD_HTTP_PORT=str(port), DUPGUARD_DB_TIMEOUT=db_timeout))
        wait_for(lambda: status(port, "/readyz") == 200 and metric(port, "dupguard_leader") == 1.0, what="leading")
        stopped = _server_processes(data)
        seen: list[str] = []
        try:
            for pid in stopped:
                _signal(pid, signal.SIGSTOP)
            # Sampled until the replica shows as down, then for a few more lock attempts (30 s at most).
            limit, shown = time.monotonic() + 30, float("inf")
            while time.monotonic() < min(limit, shown + 5):
                seen.append(body(port, "/readyz"))
                if shown == float("inf") and seen[-1].startswith("not ok"):
                    shown = time.monotonic()
                time.sleep(0.05)
        finally:
            for pid in stopped:
                _signal(pid, signal.SIGCONT)
    assert not [b for b in seen if "another replica holds the leader lock" in b], sorted(set(seen))
    # Down, naming what failed: the lock check, or the database when a poll's deadline came first.
    down = {b.split(":")[1].strip() for b in seen if b.startswith("not ok")}
    assert down and down <= {"lock_unavailable", "database_unreachable"}, sorted(set(seen))

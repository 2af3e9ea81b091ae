"""Leader election through a real PgBouncer (Debian's), as with the official chart's
``pgbouncer.enabled: true``: the default settings must never give two leaders, in transaction or in
session pooling, across 20 leader kills."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from detector.app.leader import LOCK_REFUSED, AdvisoryLock
from detector.config import SETTINGS_BY_NAME
from detector.metadb.engine import make_engine, parse_url
from tests.integration.test_run_process import events, free_port, metric, spawn, status
from tests.pg import Templates
from tests.pgbouncer import pgbouncer

pytestmark = pytest.mark.integration
LEASE = timedelta(seconds=3)


@pytest.fixture(params=["transaction", "session"])
def pool_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(pg_templates: Templates) -> str:
    return pg_templates.clone("3.1.2")


@pytest.fixture
def bouncer_url(db_url: str, pool_mode: str) -> Iterator[str]:
    with pgbouncer(db_url, pool_mode) as url:
        yield url


def _lock(url: str, **kwargs: str) -> AdvisoryLock:
    key = int(SETTINGS_BY_NAME["lock_key"].default)
    return AdvisoryLock(make_engine(parse_url(url), pool_size=1), key, lease=LEASE, **kwargs)


def test_default_settings_one_holder_through_pgbouncer(bouncer_url: str, pool_mode: str) -> None:
    """Two contenders with the default lock mode, both through PgBouncer: exactly one holds the lock,
    and after the holder releases it the other takes it."""
    now = datetime.now(UTC)
    a, b = _lock(bouncer_url), _lock(bouncer_url)
    try:
        assert a.ensure(now) is True
        for _ in range(5):  # heartbeats and retries interleave on PgBouncer's server connections
            assert a.ensure(now) is True
            assert b.ensure(now) is False
        a.release()
        assert b.ensure(now) is True
        assert a.ensure(now) is False
    finally:
        a.release()
        b.release()


def test_auto_mode_picks_the_lock_by_connection(db_url: str, bouncer_url: str, pool_mode: str) -> None:
    """`auto` takes the session lock on a direct connection and through session pooling (both pin the
    session), the transaction lock through transaction pooling (tests/integration/test_lock_pinning.py)."""
    now = datetime.now(UTC)
    direct, pooled = _lock(db_url, mode="auto"), _lock(bouncer_url, mode="auto")
    try:
        assert direct.ensure(now) and direct.lock_kind == "session"
        direct.release()
        assert pooled.ensure(now) and pooled.lock_kind == ("session" if pool_mode == "session" else "transaction")
    finally:
        direct.release()
        pooled.release()


@pytest.mark.parametrize("pool_mode", ["transaction"])
def test_session_mode_refuses_to_lead_through_pgbouncer(bouncer_url: str) -> None:
    """An explicit session lock through transaction pooling is refused, with a reason naming the setting
    (through session pooling it leads: tests/integration/test_lock_pinning.py)."""
    lock = _lock(bouncer_url, mode="session")
    try:
        assert lock.ensure(datetime.now(UTC)) is False
        assert lock.problem is not None and lock.problem.code == LOCK_REFUSED
        assert "DUPGUARD_LOCK_MODE" in lock.problem.reason
    finally:
        lock.release()


KILLS = 20


def test_twenty_leader_kills_never_two_leaders(
    db_url: str,
    bouncer_url: str,
    pool_mode: str,
    tmp_path: Path,
    procs: list,  # type: ignore[type-arg]
) -> None:
    """Two `dupguard run` replicas through PgBouncer with default settings; the leader is SIGKILLed 20
    times (and restarted). Sampled every 50 ms, never two leaders; the standby leads within 5 s of
    each kill; every duplicate made meanwhile is detected by exactly one replica (in-memory ledgers and
    no look-back, so two leaders would both report it)."""
    from tests.writer import AirflowWriter

    ports = [free_port(), free_port()]
    env = {"DUPGUARD_LEDGER": "off", "DUPGUARD_STARTUP_LOOKBACK": "0s", "DUPGUARD_POLL_INTERVAL": "20ms"}
    logs = [[tmp_path / f"r0-{i}.log" for i in range(KILLS + 1)], [tmp_path / f"r1-{i}.log" for i in range(KILLS + 1)]]
    lives = [0, 0]

    def start(r: int) -> None:
        p = spawn(bouncer_url, logs[r][lives[r]], DUPGUARD_HTTP_PORT=str(ports[r]), **env)
        procs.append(p)
        current[r] = p

    current: list = [None, None]  # type: ignore[type-arg]
    samples: list[tuple[float | None, float | None]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append((_leader(ports[0]), _leader(ports[1])))
            stop.wait(0.05)

    def detections() -> int:
        return sum(
            1 for r in (0, 1) for f in logs[r][: lives[r] + 1] if f.exists()
            for e in events(f) if e["event"] == "duplicate_detected"
        )  # fmt: skip

    def watching(r: int) -> int:
        f = logs[r][lives[r]]
        return sum(1 for e in events(f) if e["event"] == "watching") if f.exists() else 0

    start(0)
    wait_for_metric(ports[0], 1.0, "first replica leads")
    start(1)
    wait_for_status(ports[1], "second replica stands by")
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    writer = AirflowWriter(db_url)
    takeovers: list[float] = []
    pairs = 0
    try:
        for kill in range(KILLS):
            leader = 0 if metric(ports[0], "dupguard_leader") == 1.0 else 1
            standby = 1 - leader
            assert metric(ports[leader], "dupguard_leader") == 1.0
            seen = watching(standby)
            current[leader].kill()
            killed_at = time.monotonic()
            current[leader].wait(10)
            wait_for_metric(ports[standby], 1.0, f"takeover {kill}", timeout=10)
            takeovers.append(time.monotonic() - killed_at)
            _wait(lambda r=standby, n=seen: watching(r) > n, f"new leader watching {kill}")
            writer.duplicate_pair(f"consumer_{kill}")
            pairs += 1
            _wait(lambda n=pairs: detections() >= n, f"pair {kill} detected", timeout=30)
            lives[leader] += 1
            start(leader)
            wait_for_status(ports[leader], f"restarted replica stands by {kill}")
        time.sleep(0.5)  # a second leader would report the last pair too
    finally:
        stop.set()
        sampler.join(5)
        writer.close()
    both = [s for s in samples if s == (1.0, 1.0)]
    print(f"{pool_mode}: {len(samples)} samples, takeover max {max(takeovers):.2f}s, "
          f"median {sorted(takeovers)[len(takeovers) // 2]:.2f}s")  # fmt: skip
    assert not both, f"{len(both)} samples with two leaders"
    assert len(samples) > 5 * KILLS  # the sampler ran throughout (about 20 a second)
    assert max(takeovers) <= 5.0
    reported = {
        f"replica {r}": [
            e["dag_id"] for f in logs[r] if f.exists() for e in events(f) if e["event"] == "duplicate_detected"
        ]
        for r in (0, 1)
    }
    assert detections() == pairs == KILLS, reported


def _leader(port: int) -> float | None:
    """The leader gauge, or None while the process is dead or dying (a reply cut off by SIGKILL)."""
    try:
        return metric(port, "dupguard_leader")
    except (OSError, http.client.HTTPException, ValueError):
        return None


def _wait(condition, what: str, timeout: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def wait_for_metric(port: int, value: float, what: str, timeout: float = 20.0) -> None:
    _wait(lambda: metric(port, "dupguard_leader") == value, what, timeout)


def wait_for_status(port: int, what: str) -> None:
    _wait(lambda: metric(port, "dupguard_leader") == 0.0 and status(port, "/readyz") == 200, what, 40.0)

"""A storm of duplicates on one leader: the lease does not wait behind the remediations. Real daemons
on real PostgreSQL (the 3.1.2 schema), real locks.

The figures (1,000 and 10,000 groups in one commit) are measured by benchmarks/storm.py."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import pytest
import sqlalchemy.exc
from sqlalchemy import Connection

from benchmarks import storm
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
POOL = 4  # the engine's pool: make_engine's pool_size 2 + max_overflow 2


def _hold_pool(running: Running, stop: threading.Event) -> Callable[[], bool]:
    """Check out the daemon's pooled connections as they come free, until none is left, and keep them
    until ``stop``: what a storm's remediation workers do while each waits on a locked row. Returns
    whether the pool is exhausted now (the poll keeps a connection of its own from the same pool)."""
    engine = running.daemon.parts.source.db.engine  # type: ignore[attr-defined]
    held: list[Connection] = []

    def hold() -> None:
        while engine.pool.checkedout() < POOL and not stop.is_set():
            with contextlib.suppress(sqlalchemy.exc.TimeoutError):  # the pool's wait ran out: again
                held.append(engine.connect())
        stop.wait()
        for conn in held:
            conn.close()

    threading.Thread(target=hold, daemon=True).start()
    return lambda: bool(engine.pool.checkedout() >= POOL)


def test_the_lease_is_renewed_while_every_pooled_connection_is_busy(
    pg_templates: Templates, daemons: list[Running], caplog: pytest.LogCaptureFixture
) -> None:
    """Every pooled connection busy for five leases: the polls and the source's ping wait for one, but
    the heartbeat (the lock's own connection) must go on. It shared one ``max_instances=1`` job with the
    ping: that job hung, its next runs were skipped, and a lone replica lost its lease."""
    url = pg_templates.clone("3.1.2", "race_asset")
    d = start_daemon(url)
    daemons.append(d)
    wait_for(d.is_leader, what="leadership")
    lock = d.daemon.parts.leadership
    lease = lock.lease.total_seconds()  # type: ignore[attr-defined]
    stop = threading.Event()
    exhausted = _hold_pool(d, stop)
    full = None
    lapsed = 0
    try:
        ends = time.monotonic() + 60
        while time.monotonic() < ends and (full is None or time.monotonic() < full + 5 * lease):
            lapsed += not lock.is_leader(d.daemon.clock())
            if full is None and exhausted():
                full = time.monotonic()
            time.sleep(0.02)
    finally:
        stop.set()
    assert full is not None, "the whole pool was never held"
    assert lapsed == 0
    skipped = [r.getMessage() for r in caplog.records if "maximum number of running instances" in r.getMessage()]
    assert not [m for m in skipped if "check_source" not in m]  # only the ping's job may wait for the pool
    assert lock.is_leader(d.daemon.clock())


def test_the_storm_benchmark_counts_from_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/storm.py measures detection from the storm's COMMIT, as its results say: a storm whose
    transaction takes 5 s more is detected no later for it. It started its clock before the transaction,
    so 10,000 groups counted the ~20 s their writing takes as detection time."""
    slow_by = 5.0
    write = AirflowWriter.storm

    def slow_storm(self: AirflowWriter, groups: int, dag_prefix: str = "storm") -> list[tuple[str, str]]:
        time.sleep(slow_by)  # inside the writing, before anything commits: the daemons see nothing yet
        return write(self, groups, dag_prefix)

    monkeypatch.setattr(AirflowWriter, "storm", slow_storm)
    row = storm.run(20, 1, 120.0, "off")
    assert row["all_detected_s"] is not None and row["all_detected_s"] < slow_by, row
    assert row["written_s"] >= slow_by

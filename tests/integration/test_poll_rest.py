"""The poll at rest (``detector.core.pace``) on a real PostgreSQL with the real Airflow 3.1.2 schema:
a queue row that stands (a DAG on an AND of assets, made by Airflow's own scheduler code) leaves the
daemon at the rest rate; a queue row that appears turns it fast, and the race pair that follows is
found while it polls fast, then it rests again.

Probes are counted where they leave the driver (a counting psycopg2 cursor on every connection: the
prepared ``EXECUTE``), not timed: the bounds are one-sided (a slow machine polls less, never more).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg2
import psycopg2.extensions
import pytest
from sqlalchemy import Engine, event

from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.prepared import top_run_id_probe
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration

PROBE = 'EXECUTE "dupguard_top_run_id"'
FAST = timedelta(milliseconds=5)


@contextmanager
def counted_probes() -> Iterator[list[float]]:
    """The monotonic time of every idle probe any engine made while this lasts sends."""
    seen: list[float] = []

    class CountingCursor(psycopg2.extensions.cursor):  # type: ignore[misc]
        def execute(self, query: Any, vars: Any = None) -> Any:
            if query == PROBE:
                seen.append(time.monotonic())
            return super().execute(query, vars)

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.cursor_factory = CountingCursor

    event.listen(Engine, "connect", on_connect)
    try:
        yield seen
    finally:
        event.remove(Engine, "connect", on_connect)


def _between(seen: list[float], start: float, end: float) -> int:
    return sum(start <= t < end for t in seen)


def _queue_rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT target_dag_id, created_at FROM asset_dag_run_queue")
        rows = cur.fetchall()
    conn.close()
    return rows


def _watching(running: Running) -> None:
    wait_for(lambda: running.detector is not None, what="the daemon watching")


def test_a_standing_queue_row_leaves_the_daemon_at_rest(pg_templates: Templates) -> None:
    """``stranded_and_waiting``: Airflow left a queue row for a DAG on an AND of assets (one asset
    updated, the other not): it may stand for hours. A standing row is no stir, so the daemon probes
    at the rest rate (4 a second here), not at ``poll_interval`` (200 a second); it still probes, so
    a run is never missed, only found up to the rest interval later."""
    url = pg_templates.clone("3.1.2", "stranded_and_waiting")
    assert _queue_rows(url), "the fixture's queue row stands"
    rest = 0.25
    with counted_probes() as seen:
        running = start_daemon(
            url, poll_interval=FAST, poll_rest_interval=timedelta(seconds=rest), poll_hold=timedelta(seconds=1)
        )
        try:
            _watching(running)
            time.sleep(1.5)  # past any hold the start could begin (none is expected)
            start = time.monotonic()
            time.sleep(3.0)
            end = time.monotonic()
            probes = _between(seen, start, end)
        finally:
            running.stop()
    assert _queue_rows(url), "the row still stands: nothing consumed it"
    assert 1 <= probes <= (end - start) / rest + 2, probes  # polling at 5 ms would be ~600


def test_a_pair_after_a_queue_row_is_found_while_polling_fast(pg_templates: Templates) -> None:
    """An asset event commits its queue row; the daemon sees it at its next rest probe and polls fast;
    the race's two runs (committed as Airflow's scheduler does, deleting the row) are judged while it
    polls fast, well before the next rest probe; after the hold it rests again."""
    url = pg_templates.clone("3.1.2")
    rest, hold = 2.0, 2.0
    with counted_probes() as seen:
        running = start_daemon(
            url, poll_interval=FAST, poll_rest_interval=timedelta(seconds=rest), poll_hold=timedelta(seconds=hold)
        )
        writer = AirflowWriter(url)
        try:
            _watching(running)
            time.sleep(0.5)
            event_id, at = writer.queued_event("consumer_q")
            queued = time.monotonic()
            # Seen at the next rest probe (within ``rest``): then fast, at least 5 probes in 100 ms.
            wait_for(lambda: _between(seen, time.monotonic() - 0.1, time.monotonic()) >= 5, rest + 5, "fast polls")
            fast_after = time.monotonic() - queued
            _first, dup = writer.race("consumer_q", event_id, at)
            committed = time.monotonic()

            def judged() -> bool:
                return any(r.run_id == dup.run_id for e in running.alerter.detected() for r in e.finding.runs)

            took = wait_for(judged, 10, "the duplicate")
            fast_before_commit = _between(seen, committed - 0.1, committed)
            time.sleep(hold + 0.5)  # the hold ends (no stir since the pair)
            start = time.monotonic()
            time.sleep(2.0)
            resting = _between(seen, start, time.monotonic())
        finally:
            writer.close()
            running.stop()
    assert fast_after <= rest + 1.0, fast_after  # the queue row was seen by a rest probe
    assert fast_before_commit >= 5, fast_before_commit  # the pair met fast polls
    assert took < rest / 2, took  # judged long before the next rest probe would have come
    assert resting <= 2, resting  # back to rest: one probe per 2 s


@pytest.mark.parametrize(
    ("version", "scenario"),
    [
        ("2.10.5", None),  # no asset queue tables are read: only the top id
        ("3.0.6", "stranded_and_waiting"),
        ("3.1.2", "stranded_max_active"),
        ("3.2.2", "race_partitioned"),  # asset_partition_dag_run rows, made by Airflow's scheduler
        ("3.3.2", "race_partitioned"),
    ],
)
def test_the_probe_reads_the_queues_each_schema_has(
    pg_templates: Templates, version: str, scenario: str | None
) -> None:
    """The prepared probe on each schema ``airflow db migrate`` makes (tables reflected, none assumed):
    the top id and, where the tables exist, what Airflow left in its queues (read back independently)."""
    url = pg_templates.clone(version, scenario)
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        with engine.connect() as conn:
            probe, prepared = top_run_id_probe(conn, db.tables)
            top, mark = probe()
            assert prepared
        with psycopg2.connect(url) as raw, raw.cursor() as cur:
            cur.execute("SELECT coalesce(max(id), 0) FROM dag_run")
            assert top == cur.fetchone()[0]
            if version.startswith("2."):
                assert mark == ()
                return
            cur.execute("SELECT count(*), max(created_at) FROM asset_dag_run_queue")
            count, newest = cur.fetchone()
            assert mark[:2] == (count, newest)
            cur.execute(
                "SELECT count(*) FROM dag_run WHERE state IN ('queued', 'running') "
                "AND dag_id IN (SELECT target_dag_id FROM asset_dag_run_queue)"
            )
            assert mark[2] == cur.fetchone()[0]
            if version >= "3.2":
                cur.execute("SELECT max(id) FROM asset_partition_dag_run")
                newest_partition = cur.fetchone()[0]
                assert newest_partition is not None and mark[3] == newest_partition
            else:
                assert len(mark) == 3
        raw.close()
    finally:
        engine.dispose()

"""The sibling lookup (``siblings.siblings_of_runs``) on every schema family it reads: the runs Airflow's
own scheduler code made on 3.0.6, 3.1.2, 3.2.2 and 3.3.2 (every committed scenario, partitioned ones
included) and dupguard's SQLite demo database. Every asset run asks at once; the answer is checked
against the definition applied to the rows as read plainly: the asset-triggered runs of the same DAG
with the same run_after, or that consumed one of its events, or (partitioned runs) with the same
partition key within the window."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from detector.app import demo
from detector.core.model import ASSET_TRIGGERED
from detector.metadb import consumption, dag_runs, siblings
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from tests.pg import FIXTURES, Templates, scenarios

pytestmark = pytest.mark.integration

VERSIONS = ["3.0.6", "3.1.2", "3.2.2", "3.3.2"]
# The scenarios with asset runs (the others are about task attempts or pending queue rows).
CASES = [
    (v, s)
    for v in VERSIONS
    for s in scenarios(v)
    if "asset_triggered" in (FIXTURES / "scenarios" / v / f"{s}.sql").read_text(encoding="utf-8")
]
WINDOW = timedelta(minutes=5)


def _check(engine: Engine) -> int:
    """Compares every asset run's siblings with the definition; returns how many runs had another."""
    db = open_airflow_db(engine)
    t = db.tables
    dr, rev = t.dag_run, t.run_events
    partitioned = t.family.has_partitions
    with engine.connect() as conn:
        cols = [dr.c.id, dr.c.dag_id, dr.c.run_type, dr.c.run_after]
        rows = conn.execute(select(*cols, *([dr.c.partition_key] if partitioned else []))).all()
        consumed: dict[int, set[int]] = defaultdict(set)
        for run_id, event_id in conn.execute(select(rev.c.dag_run_id, rev.c.event_id)):
            consumed[run_id].add(event_id)
        runs = [r for r in dag_runs.new_runs(conn, t, 0, [], 100_000) if r.run_type == ASSET_TRIGGERED]
        events = consumption.consumed_events(conn, t, [r.id for r in runs])
        found = siblings.siblings_of_runs(conn, t, runs, events, WINDOW, per_statement=7)  # several batches
    key = {r.id: (r.partition_key if partitioned else None) for r in rows}
    assert runs, "the database has asset runs to ask about"
    with_others = 0
    for run in runs:
        expected = sorted(
            r.id
            for r in rows
            if r.dag_id == run.dag_id
            and r.run_type == ASSET_TRIGGERED
            and (
                r.run_after == run.run_after
                or consumed[r.id] & consumed[run.id]
                or (
                    run.partition_key is not None
                    and key[r.id] == run.partition_key
                    and abs(r.run_after - run.run_after) <= WINDOW
                )
            )
        )
        assert sorted(s.id for s in found[run.id]) == expected, (run.run_id, expected)
        with_others += len(expected) > 1
    return with_others


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_siblings_on_runs_airflow_made(version: str, scenario: str, pg_templates: Templates) -> None:
    """Every asset run of the scenario gets exactly the siblings the definition gives it."""
    engine = make_engine(parse_url(pg_templates.clone(version, scenario)))
    try:
        _check(engine)
    finally:
        engine.dispose()


def test_every_way_of_being_a_sibling_is_met_somewhere() -> None:
    """The scenarios are not all alone runs: runs sharing run_after, events and partition keys are there."""
    assert any("partition" in s for v, s in CASES if v in ("3.2.2", "3.3.2"))
    assert any("race_overlap" in s for _, s in CASES)


def test_siblings_on_the_sqlite_demo_database(tmp_path: Path) -> None:
    """dupguard's SQLite demo: the same statement, the same answers, and its seeded duplicates found."""
    engine = demo.build(tmp_path / "airflow.db")
    try:
        assert _check(engine) >= 2
    finally:
        engine.dispose()

"""A storm's sibling lookups on real PostgreSQL (the 3.1.2 schema): both runs of a pair are new in one
poll and ask the same question, which is sent once."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, event
from sqlalchemy.engine.default import CACHE_HIT

from detector.metadb import consumption, dag_runs, siblings
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.schema import AirflowTables
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration


def test_a_storms_pairs_ask_for_their_siblings_once_and_each_run_gets_the_answer(pg_templates: Templates) -> None:
    """100 duplicate pairs committed at once: their 200 runs are 100 distinct questions (DAG, run_after,
    events), one statement of 100 askers, not two; every run gets exactly the siblings it gets when asked
    alone (its pair, itself included)."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    pairs = writer.storm(100)
    writer.close()
    engine = make_engine(parse_url(url))
    db = open_airflow_db(engine)
    t = db.tables
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "UNION" in statement:
            statements.append(statement)

    try:
        with engine.connect() as conn:
            runs = dag_runs.new_runs(conn, t, 0, [], 1000)
            assert len(runs) == 200
            events = consumption.consumed_events(conn, t, [r.id for r in runs])
            window = timedelta(minutes=5)
            event.listen(engine, "before_cursor_execute", count)
            found = siblings.siblings_of_runs(conn, t, runs, events, window, per_statement=100)
            event.remove(engine, "before_cursor_execute", count)
            alone = {r.id: siblings.sibling_runs(conn, t, r, events[r.id], window) for r in runs}
    finally:
        engine.dispose()
    assert len(statements) == 1
    assert {k: sorted(s.id for s in v) for k, v in found.items()} == {
        k: sorted(s.id for s in v) for k, v in alone.items()
    }
    by_run_id = {r.run_id: r.id for r in runs}
    for kept, dup in pairs:
        assert sorted(s.id for s in found[by_run_id[dup]]) == sorted([by_run_id[kept], by_run_id[dup]])


def _storm_database(pg_templates: Templates, groups: int) -> tuple[Engine, AirflowTables]:
    """A fresh 3.1.2 database holding a storm of ``groups`` duplicate pairs, and its engine and tables."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    writer.storm(groups)
    writer.close()
    engine = make_engine(parse_url(url))
    return engine, open_airflow_db(engine).tables


def test_batches_of_any_size_reuse_one_compiled_statement(pg_templates: Templates) -> None:
    """The askers' keys are bound arrays, not SQL text: batches of 30, 30, 30 and 10 questions send
    the same statement, compiled once (SQLAlchemy's compiled cache). A VALUES list, or a UNION of arms
    per run, was compiled anew for each batch of another size: a storm's detection spent seconds there."""
    engine, t = _storm_database(pg_templates, 100)
    hits: list[bool] = []

    def seen(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        if "unnest" in statement or "UNION" in statement:
            hits.append(context.cache_hit is CACHE_HIT)

    try:
        with engine.connect() as conn:
            runs = dag_runs.new_runs(conn, t, 0, [], 1000)
            events = consumption.consumed_events(conn, t, [r.id for r in runs])
            event.listen(engine, "before_cursor_execute", seen)
            found = siblings.siblings_of_runs(conn, t, runs, events, timedelta(minutes=5), per_statement=30)
            event.remove(engine, "before_cursor_execute", seen)
    finally:
        engine.dispose()
    assert all(len(v) == 2 for v in found.values()), "each run of a pair: itself and its twin"
    assert hits == [False, True, True, True]


def test_the_sibling_statement_is_built_once_per_shape(pg_templates: Templates) -> None:
    """On PostgreSQL two polls' batches of other runs get the same statement object, their keys in its
    parameters: building the UNION and its cache key at every poll cost a lone pair more than the
    statement's round trip. The answers are the same as asking each run alone."""
    engine, t = _storm_database(pg_templates, 6)
    window = timedelta(minutes=5)
    try:
        with engine.connect() as conn:
            runs = dag_runs.new_runs(conn, t, 0, [], 1000)
            events = consumption.consumed_events(conn, t, [r.id for r in runs])
            first, first_keys = siblings._siblings_statement(t, runs[:4], events, window, "postgresql")
            second, second_keys = siblings._siblings_statement(t, runs[4:], events, window, "postgresql")
            alone = {r.id: sorted(s.id for s in siblings.sibling_runs(conn, t, r, events[r.id], window)) for r in runs}
            found = siblings.siblings_of_runs(conn, t, runs, events, window, per_statement=4)
    finally:
        engine.dispose()
    assert first is second
    assert first_keys["sibling_dags"] == sorted({r.dag_id for r in runs[:4]}) != second_keys["sibling_dags"]
    assert {k: sorted(s.id for s in v) for k, v in found.items()} == alone

"""Asset events committed after the run whose window held them (docs/explanation/airflow-internals.md, "Committed
late"), on databases made by Airflow's own code: every scenario of every version is loaded into the real test
PostgreSQL and ``stranded_late_candidates`` + ``find_late`` must find exactly the events Airflow left
consumed by no run inside a run's window (``expected_committed_late``, recorded from Airflow's records),
and nothing elsewhere: the late commits that were not lost (``stranded_late_next_window``,
``stranded_late_own_row``), the ordinary stranded events, the duplicates and partitions.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from detector.checks.stranded_events import statements
from detector.checks.stranded_events.rule import find_stranded
from detector.checks.stranded_events.rule_late import find_late
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

VERSIONS = ["3.0.6", "3.1.2", "3.2.2", "3.3.2"]
CASES = [(v, s) for v in VERSIONS for s in scenarios(v)]
LATE = {"stranded_late_commit", "stranded_late_next_window", "stranded_late_own_row"}


def late_in(url: str, before: str | None = None) -> list[tuple[str, list[int], str]]:
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        with engine.connect() as conn:
            if before:
                conn.execute(text(before))
            found = find_late(statements.stranded_late_candidates(conn, db.tables, None))
    finally:
        engine.dispose()
    return [(s.dag_id, list(s.event_ids), s.run_id) for s in found]


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_exactly_the_events_airflow_lost_to_a_late_commit_are_found(
    version: str, scenario: str, pg_templates: Templates
) -> None:
    truth = ground_truth(version, scenario)
    expected = [(s["dag_id"], s["event_ids"], s["window_run_id"]) for s in truth.get("expected_committed_late", [])]
    assert late_in(pg_templates.clone(version, scenario)) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_has_the_late_commit_and_its_look_alikes(version: str) -> None:
    """Open in every supported version: the loss and the two late commits that were not lost."""
    assert set(scenarios(version)) >= LATE
    assert ground_truth(version, "stranded_late_commit")["expected_committed_late"]
    for look_alike in LATE - {"stranded_late_commit"}:
        assert ground_truth(version, look_alike)["expected_committed_late"] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_stranded_rule_alone_misses_the_late_event(version: str, pg_templates: Templates) -> None:
    """The gap this closes: ``detector.checks.stranded_events.rule`` judges events after the latest run's
    run_after only, and Airflow's late event is before it (so it is inside the window)."""
    url = pg_templates.clone(version, "stranded_late_commit")
    engine = make_engine(parse_url(url))
    try:
        with engine.connect() as conn:
            assert find_stranded(statements.stranded_event_candidates(conn, open_airflow_db(engine).tables, None)) == []
    finally:
        engine.dispose()
    [truth] = ground_truth(version, "stranded_late_commit")["expected_committed_late"]
    late = str(truth["event_ids"][0])
    window_run = next(
        r for r in ground_truth(version, "stranded_late_commit")["runs"] if r["run_id"] == truth["window_run_id"]
    )
    assert ground_truth(version, "stranded_late_commit")["notes"]["timestamps"][late] <= window_run["run_after"]


@pytest.mark.parametrize("version", ["3.1.2", "3.3.2"])
def test_runs_purged_by_db_clean_leave_no_false_late_event(version: str, pg_templates: Templates) -> None:
    """``airflow db clean`` deletes the oldest runs (their dagrun_asset_event rows go with them, ON DELETE
    CASCADE): their events are consumed by no run now, but older than every event a kept run consumed."""
    url = pg_templates.clone(version, "stranded_late_commit")
    first = "DELETE FROM dag_run WHERE id = (SELECT min(id) FROM dag_run WHERE dag_id = 'orders_consumer')"
    assert late_in(url, first) == []  # the late event's window lost its lower end with the purged run
    url = pg_templates.clone(version, "stranded_race")
    assert late_in(url, first) == []

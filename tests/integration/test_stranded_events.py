"""Stranded asset events (apache/airflow#56050) on databases made by Airflow's own code.

Every scenario of every version (tests/fixtures/scenarios: the stranded_* ones of
scripts/airflow/scenarios_stranded.py and every older one, duplicates and partitions included) is
loaded into the real test PostgreSQL; the rule must find exactly the events Airflow left consumed by
no run and queued nowhere (``expected_stranded``, recorded from Airflow's records), and nothing in
the look-alikes.
"""

from __future__ import annotations

import pytest

from detector.checks.stranded_events import rule_pauses, statements
from detector.checks.stranded_events.rule import find_stranded
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.schema import Family
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

VERSIONS = ["3.0.6", "3.1.2", "3.2.2", "3.3.2"]
CASES = [(v, s) for v in VERSIONS for s in scenarios(v)]
STRANDED_SCENARIOS = {s for _, s in CASES if s.startswith("stranded_")}


def stranded_in(url: str, *, pauses_read: bool = True) -> list[tuple[str, list[int], str]]:
    """The sets found, the events' pause state read from Airflow's log as the check does."""
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        with engine.connect() as conn:
            candidates = statements.stranded_event_candidates(conn, db.tables, None)
            if pauses_read and candidates:
                log = statements.pause_log(
                    conn,
                    db.tables,
                    {c.dag_id for c in candidates},
                    patch_direction=db.info.family != Family.AIRFLOW_3_0,
                )
                candidates = rule_pauses.with_pauses(candidates, log)
            found = find_stranded(candidates)
    finally:
        engine.dispose()
    return [(s.dag_id, list(s.event_ids), s.run_id) for s in found]


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_exactly_the_events_airflow_stranded_are_found(version: str, scenario: str, pg_templates: Templates) -> None:
    truth = ground_truth(version, scenario)
    expected = [(s["dag_id"], s["event_ids"], s["stranding_run_id"]) for s in truth.get("expected_stranded", [])]
    assert stranded_in(pg_templates.clone(version, scenario)) == expected


@pytest.mark.parametrize("version", VERSIONS)
def test_every_version_has_the_race_and_the_look_alikes(version: str) -> None:
    """The bug is open in every supported version: each one has its Airflow-made stranded fixtures."""
    have = {s for s in scenarios(version) if s.startswith("stranded_")}
    assert have == STRANDED_SCENARIOS and "stranded_race" in have
    assert ground_truth(version, "stranded_race")["expected_stranded"]


@pytest.mark.parametrize("version", [v for v in VERSIONS if "stranded_paused_run" in scenarios(v)])
def test_events_registered_while_paused_are_stranded_only_to_a_rule_without_the_log(
    version: str, pg_templates: Templates
) -> None:
    """Paused (CLI), two events, unpaused, the run of the row queued before the pause: the log's
    cli_dag_pause / cli_dag_unpause rows say the events came while paused."""
    url = pg_templates.clone(version, "stranded_paused_run")
    truth = ground_truth(version, "stranded_paused_run")
    assert stranded_in(url) == []
    [(_, ids, _)] = stranded_in(url, pauses_read=False)  # what the rule without the log reported
    assert ids == truth["notes"]["events_while_paused"]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_cleared_look_alike_would_fool_a_rule_dating_runs_by_queued_at(
    version: str, pg_templates: Templates
) -> None:
    """Airflow's clear rewrote queued_at after the paused-time event: only clear_number (3.0/3.1) and
    created_at (3.2+) tell the run was not created after it."""
    engine = make_engine(parse_url(pg_templates.clone(version, "stranded_cleared")))
    try:
        with engine.connect() as conn:
            [c] = statements.stranded_event_candidates(conn, open_airflow_db(engine).tables, None)
    finally:
        engine.dispose()
    assert c.run_clear_number == 1 and c.run_queued_at is not None and c.run_queued_at > c.timestamp
    assert not c.consumed and c.queue_rows == 0

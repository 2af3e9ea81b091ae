"""The end-to-end ground truth (``tests/e2e/truth.read_groups``) on databases made by Airflow's own code.

Each scenario fixture (``tests/fixtures/scenarios/<version>/``, scripts/airflow/) records its
duplicate groups from which scheduler job created which run, never from a rule on run_after or event
sets. The truth, read from the same rows through one run per event per consumer DAG, must find exactly
those groups: the exact race, the overlap race (different run_after), the partitioned race, and none
of the look-alikes (fan-out, successive runs, AND/OR conditions, cleared runs, partition fan-out and
re-runs).
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from tests.e2e.truth import read_groups
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

VERSIONS = ["3.0.6", "3.1.2", "3.2.2", "3.3.2"]
CASES = [(v, s) for v in VERSIONS for s in scenarios(v)]
# The kinds this truth is about: one asset event processed by more than one run of one consumer.
EVENT_KINDS = {"asset", "partitioned"}


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_truth_finds_exactly_the_groups_airflow_made(version: str, scenario: str, pg_templates: Templates) -> None:
    truth = ground_truth(version, scenario)
    # Runs of a split partition key (split_or, apache/airflow#71070) each consumed their own event:
    # one key processed twice, not one event; that truth is the APDR rows (test_split_partitions.py).
    recorded = [g for g in truth["expected_groups"] if g["kind"] in EVENT_KINDS and "split_apdr_ids" not in g]
    job_of = {r["run_id"]: r["creating_job_id"] for r in truth["runs"]}
    engine = create_engine(make_url(pg_templates.clone(version, scenario)).set(drivername="postgresql+psycopg2"))
    try:
        with engine.connect() as conn:
            groups = read_groups(conn)
    finally:
        engine.dispose()
    assert sorted((g["dag_id"], sorted(g["run_ids"])) for g in groups) == sorted(
        (g["dag_id"], sorted(g["run_ids"])) for g in recorded
    )
    for g in groups:
        match = next(r for r in recorded if sorted(r["run_ids"]) == sorted(g["run_ids"]))
        assert g["events"] == sorted(match["shared_event_ids"])
        assert g["creating_job_ids"] == [job_of[r] for r in g["run_ids"]]
        assert len(set(g["creating_job_ids"])) == len(g["ids"])  # every run from another scheduler job

"""trigger_flapping's reads on databases Airflow's own code wrote, one dump per triggerer loop
(tests/fixtures/scenarios/<ver>/triggers/, scripts/airflow/scenarios_triggers.py).

Ground truth: the owner changes Airflow made while its own alive query held the previous owner alive
(``expected_flapping``), and the DAGs each trigger feeds as the scenario's DAG file declared them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from detector.checks.trigger_flapping import statements
from detector.checks.trigger_flapping.rule import ASSET, CALLBACK, UNPROTECTED, Owner, exposure, judge_owners
from detector.checks.trigger_flapping.statements import trigger_tables
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from tests.pg import Templates
from tests.unit.test_trigger_flapping import CASES, _truth

pytestmark = pytest.mark.integration


def _read(url: str, remembered: set[int]) -> tuple[str, list[Any], list[Any], list[Any]]:
    """(family, trigger rows, owner jobs, every triggerer job) read through dupguard's queries."""
    db = open_airflow_db(make_engine(parse_url(url)))
    tt = trigger_tables(db.info.family)
    try:
        with db.engine.connect() as conn:
            triggers = statements.flapping_candidates(conn, tt)
            owners = {t.triggerer_id for t in triggers if t.triggerer_id is not None} | remembered
            return (
                db.info.family.value,
                triggers,
                statements.triggerer_jobs_by_id(conn, tt, owners),
                statements.triggerer_jobs_since(conn, tt, None),
            )
    finally:
        db.engine.dispose()


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_live_looks_at_each_loop_find_exactly_the_flapping_airflow_did(
    version: str, scenario: str, pg_templates: Templates
) -> None:
    truth = _truth(version, scenario)
    threshold = timedelta(seconds=truth["health_check_threshold_seconds"])
    memory: dict[tuple[int, datetime], Owner] = {}
    found = []
    for i, sample in enumerate(truth["samples"]):
        _, triggers, jobs, _ = _read(
            pg_templates.clone(version, sample["fixture"]), {o.job_id for o in memory.values()}
        )
        assert [(t.id, t.triggerer_id) for t in triggers] == [(t["id"], t["triggerer_id"]) for t in sample["triggers"]]
        flaps, memory = judge_owners(triggers, jobs, memory, datetime.fromisoformat(sample["db_now"]), threshold)
        found += [(f.trigger.id, f.previous.id, f.trigger.triggerer_id, i) for f in flaps]
    assert found == [(f["trigger_id"], f["from_job"], f["to_job"], f["sample"]) for f in truth["expected_flapping"]]


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_each_trigger_is_read_with_the_dags_it_feeds(version: str, scenario: str, pg_templates: Templates) -> None:
    """Asset trigger -> asset_trigger/asset_watcher -> asset -> consumer DAGs; callback -> its run's DAG."""
    truth = _truth(version, scenario)
    _, triggers, _, _ = _read(pg_templates.clone(version, truth["samples"][-1]["fixture"]), set())
    assert triggers, "every scenario leaves its trigger"
    for t in triggers:
        if scenario == "flip_callback":
            assert (t.kind, t.assets, t.dag_ids) == (CALLBACK, (), ("late_report",))
        else:
            assert (t.kind, t.assets, t.dag_ids) == (ASSET, ("orders",), tuple(truth["consumer_dag_ids"]))


@pytest.mark.parametrize(
    ("version", "scenario", "expected"),
    [
        ("3.0.6", "flip_asset", [(ASSET, True)]),
        ("3.1.2", "flip_asset", [(ASSET, True)]),
        ("3.1.2", "flip_callback", [(CALLBACK, True)]),  # deadline.trigger_id, no callback table
        ("3.2.2", "flip_asset", [(ASSET, False)]),  # one alembic head for 3.2.0-3.2.2: uncertain
        ("3.2.2", "flip_callback", [(CALLBACK, True)]),  # no callback filter in any 3.2
        ("3.3.2", "flip_asset", []),
        ("3.3.2", "flip_callback", [(CALLBACK, True)]),
    ],
)
def test_one_look_reports_the_exposure_from_the_version_and_the_triggerer_jobs(
    version: str, scenario: str, expected: list[tuple[str, bool]], pg_templates: Templates
) -> None:
    truth = _truth(version, scenario)
    family, triggers, _, jobs = _read(pg_templates.clone(version, truth["samples"][-1]["fixture"]), set())
    found = exposure(triggers, jobs, UNPROTECTED[family])
    assert [(e.trigger.kind, e.certain_version) for e in found] == expected
    assert all({j.hostname for j in e.jobs} == {"triggerer-a", "triggerer-b"} for e in found)

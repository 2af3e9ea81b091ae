"""Scan and version detection on real Airflow schemas and on duplicates made by Airflow's own code."""

from __future__ import annotations

import json

import pytest

from detector.app.cli import main
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

VERSIONS_3 = ["3.0.6", "3.1.2", "3.2.2", "3.3.2"]
SCENARIOS = [(v, s) for v in VERSIONS_3 for s in scenarios(v)]


def _in_range(version: str, spec: str) -> bool:
    """Whether ``version`` satisfies a ">=a,<b" range as dupguard reports it."""

    def key(v: str) -> tuple[int, ...]:
        return tuple(int(p) for p in v.split("."))

    bounds = dict((part[:2] if part[1] == "=" else part[:1], part.lstrip("<>=")) for part in spec.split(","))
    return key(bounds[">="]) <= key(version) and ("<" not in bounds or key(version) < key(bounds["<"]))


def _scan_json(url: str, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    code = main(["scan", "--database-url", url, "--format", "json", *extra])
    out = capsys.readouterr().out
    return code, json.loads(out)


@pytest.mark.parametrize("version", VERSIONS_3)
def test_empty_database_of_each_version_is_identified_and_clean(
    version: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each supported schema, straight from `airflow db migrate`, is read and named exactly."""
    code, doc = _scan_json(pg_templates.clone(version), capsys)
    assert code == 0
    assert _in_range(version, doc["airflow_version"])
    assert doc["schema_family"] == version.rsplit(".", 1)[0]
    assert doc["groups"] == []


def test_airflow_2_is_reported_as_immune(pg_templates: Templates, capsys: pytest.CaptureFixture[str]) -> None:
    """Airflow 2.10 cannot produce these duplicates: say so and exit 0."""
    code = main(["scan", "--database-url", pg_templates.clone("2.10.5")])
    assert code == 0
    assert "Airflow 2 cannot create duplicate" in capsys.readouterr().out


# Suspected groups Airflow made that dupguard reports as a periodic check's observation, not as a group: one Redis
# message delivered to two triggerers is told from two equal messages only by its body, so it is a suspected copy set
# of the trigger_flapping check (docs/explanation/airflow-internals.md, "One message, one asset event per
# triggerer"), never a group.
AS_OBSERVATIONS = {"trigger_event"}


@pytest.mark.parametrize(("version", "scenario"), SCENARIOS, ids=[f"{v}-{s}" for v, s in SCENARIOS])
def test_scenarios_made_by_airflow_match_ground_truth(
    version: str, scenario: str, pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every group Airflow's own scheduler code produced is found, and nothing else is confirmed."""
    truth = ground_truth(version, scenario)
    code, doc = _scan_json(pg_templates.clone(version, scenario), capsys)
    confirmed = [g for g in doc["groups"] if g["confidence"] == "confirmed"]
    found = sorted((g["dag_id"], sorted([g["kept_run_id"], *g["duplicate_run_ids"]])) for g in confirmed)
    expected = sorted((g["dag_id"], sorted(g["run_ids"])) for g in truth["expected_groups"])
    assert found == expected
    for group in confirmed:
        match = next(g for g in truth["expected_groups"] if g["dag_id"] == group["dag_id"])
        assert group["kept_run_id"] == match["first_run_id"]
        assert group["shared_event_ids"] == sorted(match["shared_event_ids"])
        assert group["kind"] == match["kind"]
        if "duplicate_task_seconds" in match:
            assert group["duplicate_task_seconds"] == pytest.approx(match["duplicate_task_seconds"], abs=0.01)
    suspected = sorted(
        (g["dag_id"], sorted([g["kept_run_id"], *g["duplicate_run_ids"]]))
        for g in doc["groups"]
        if g["confidence"] == "suspected"
    )
    truth_suspected = [g for g in truth.get("suspected_groups", []) if g["kind"] not in AS_OBSERVATIONS]
    assert suspected == sorted((g["dag_id"], sorted(g["run_ids"])) for g in truth_suspected)
    copies = sorted(
        (o["dag_ids"][0], sorted(o["run_ids"]))
        for o in doc["checks"].get("trigger_flapping", [])
        if o.get("reason") == "copies_without_id"
    )
    truth_copies = [g for g in truth.get("suspected_groups", []) if g["kind"] in AS_OBSERVATIONS]
    assert copies == sorted((g["dag_id"], sorted(g["run_ids"])) for g in truth_copies)
    assert code == (1 if doc["groups"] or any(doc["checks"].values()) else 0)  # split partitions are a check too
    stranded = doc["checks"].get("stranded_events", [])
    # docs/explanation/airflow-internals.md, "Committed late"
    late = [s for s in stranded if s.get("reason") == "committed_late"]
    assert sorted((s["dag_id"], s["event_ids"], s["run_id"]) for s in stranded if s not in late) == sorted(
        (s["dag_id"], s["event_ids"], s["stranding_run_id"]) for s in truth.get("expected_stranded", [])
    )
    assert sorted((s["dag_id"], s["event_ids"], s["run_id"]) for s in late) == sorted(
        (s["dag_id"], s["event_ids"], s["window_run_id"]) for s in truth.get("expected_committed_late", [])
    )

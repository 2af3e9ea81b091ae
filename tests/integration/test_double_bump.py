"""double_bump's reads and rule on databases Airflow's own code wrote (tests/fixtures/scenarios/<ver>/
{double_bump,bump_*}, scripts/airflow/scenarios_double_bump.py).

Ground truth is what Airflow recorded: the TI rows before scheduler-a's stale update (``before``: what
the previous live pass saw) and after it (``expected_bumps``: same id, try up by one, no history row),
never dupguard's rule.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from detector.app.cli import main
from detector.app.ledger import MemoryLedger
from detector.checks import enabled as checks
from detector.checks.double_bump.check import DoubleBumpCheck
from detector.checks.double_bump.rule import TiRow
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.core.checks import CheckContext, Observation
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.integration.test_split_partitions import _daemon  # the daemon with every check, a recording alerter
from tests.pg import Templates, ground_truth, scenarios

pytestmark = pytest.mark.integration

AFFECTED = ["3.0.6", "3.1.2"]
CASES = [(v, s) for v in [*AFFECTED, "3.2.2"] for s in scenarios(v) if s == "double_bump" or s.startswith("bump_")]


def _remembered(truth: dict[str, Any]) -> dict[str, TiRow]:
    """The previous pass's memory: the TI rows Airflow had written just before the stale update."""
    return {
        r["id"]: TiRow(
            r["id"], r["dag_id"], r["task_id"], r["run_id"], r["map_index"], r["try_number"], r["state"],
            r["hostname"], r["queued_by_job_id"], None, "remembered",
        )
        for r in truth["before"]
        if r["state"] in ("scheduled", "queued", "running")
    }  # fmt: skip


def _collect(
    url: str, live: bool, memory: dict[str, TiRow] | None = None, truth: dict[str, Any] | None = None
) -> list[Observation]:
    db = open_airflow_db(make_engine(parse_url(url)))
    # The generator's [scheduler] scheduler_health_check_threshold, as a deployment configures dupguard.
    threshold = ((truth or {}).get("notes") or {}).get("health_check_threshold_s")
    kw = {"double_bump_health_check_threshold": timedelta(seconds=threshold)} if threshold else {}
    check = DoubleBumpCheck(Config.of(database_url=url, **kw), Metrics())
    check.memory = dict(memory or {})
    now = datetime.now(UTC)
    try:
        with db.engine.connect() as conn:
            return check.collect(conn, db, CheckContext(db_now=now, now=now, live=live))
    finally:
        db.engine.dispose()


def _expected(truth: dict[str, Any]) -> list[tuple[str, str, list[int]]]:
    return [(b["ti_id"], b["run_id"], b["tries"]) for b in truth["expected_bumps"]]


def _found(obs: list[Observation]) -> list[tuple[str, str, list[int]]]:
    return [(o.facts["ti_id"], o.facts["run_id"], o.facts["tries"]) for o in obs]


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_live_pass_confirms_exactly_the_bumps_airflow_made(
    version: str, scenario: str, pg_templates: Templates
) -> None:
    """Memory of the previous pass + the rows now: the race is confirmed with its hosts; look-alikes are not."""
    truth = ground_truth(version, scenario)
    found = _collect(pg_templates.clone(version, scenario), live=True, memory=_remembered(truth), truth=truth)
    assert _found(found) == _expected(truth)
    for obs, bump in zip(found, truth["expected_bumps"], strict=True):
        assert obs.confidence == "confirmed" and obs.key == f"double_bump:{bump['ti_id']}:{bump['tries'][0]}"
        assert obs.facts["hosts"] == [bump["before"]["hostname"], bump["after"]["hostname"]]
        host_of = {job: host for host, job in bump["scheduler_job_ids"].items()}
        queuers = [bump["before"]["queued_by_job_id"], bump["after"]["queued_by_job_id"]]
        assert obs.facts["schedulers"] == [host_of[j] for j in queuers]  # b queued try 1, a try 2


@pytest.mark.parametrize(("version", "scenario"), CASES, ids=[f"{v}-{s}" for v, s in CASES])
def test_after_the_fact_the_same_bumps_are_suspected(version: str, scenario: str, pg_templates: Templates) -> None:
    """No memory (scan): the same TIs, suspected (Airflow keeps no earlier id); none on the look-alikes."""
    truth = ground_truth(version, scenario)
    found = _collect(pg_templates.clone(version, scenario), live=False, truth=truth)
    assert _found(found) == _expected(truth)
    assert all(o.confidence == "suspected" for o in found)


@pytest.mark.parametrize("version", AFFECTED)
def test_every_affected_version_has_the_race_and_the_look_alikes(version: str) -> None:
    have = {s for s in scenarios(version) if s == "double_bump" or s.startswith("bump_")}
    assert have == {"double_bump", "bump_retry", "bump_cleared", "bump_orphan_reset", "bump_after_stop"}
    assert ground_truth(version, "double_bump")["expected_bumps"]


def test_the_fixed_version_leaves_nothing_to_find() -> None:
    """3.2.2 (PR #60330's state guard): scheduler-a's stale update matched no row."""
    truth = ground_truth("3.2.2", "double_bump")
    assert truth["expected_bumps"] == [] and [r["try_number"] for r in truth["task_instances"]] == [1, 1]


def test_scan_reports_the_suspected_bump(pg_templates: Templates, capsys: pytest.CaptureFixture[str]) -> None:
    truth = ground_truth("3.1.2", "double_bump")
    main(["scan", "--database-url", pg_templates.clone("3.1.2", "double_bump"), "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    [entry] = doc["checks"]["double_bump"]
    [bump] = truth["expected_bumps"]
    assert (entry["ti_id"], entry["tries"], entry["confidence"]) == (bump["ti_id"], [1, 2], "suspected")


class Recorder:
    def __init__(self) -> None:
        self.notices: list[Any] = []

    def notify_notice(self, notice: Any) -> None:
        self.notices.append(notice)


def test_run_alerts_a_bump_once_across_runs_and_never_again(pg_templates: Templates) -> None:
    """The daemon's check runner (as `run` schedules it), twice on one ledger: one alert, with the task,
    the tries and the hosts; the second run still finds it (the same key) and sends nothing."""
    url = pg_templates.clone("3.1.2", "double_bump")
    [bump] = ground_truth("3.1.2", "double_bump")["expected_bumps"]
    config = Config.of(database_url=url)
    db = open_airflow_db(make_engine(parse_url(url)))
    ledger, metrics, recorder = MemoryLedger(), Metrics(), Recorder()
    built = checks.build(config, db, metrics)
    assert "double_bump" in [c.kind for c in built]
    runner = CheckRunner(db, built, ledger, recorder, metrics, cluster="prod-eu")
    now = datetime.now(UTC)
    try:
        assert len(runner.run("double_bump", now)) == 1
        assert len(runner.run("double_bump", now)) == 1
    finally:
        db.engine.dispose()
    [notice] = recorder.notices
    payload = notice.payload
    assert (payload["type"], payload["dedup_key"]) == ("double_bump", f"double_bump:{bump['ti_id']}:1")
    assert payload["observation"]["task_id"] == "load" and payload["observation"]["tries"] == [1, 2]
    assert payload["observation"]["hosts"] == ["worker-2"]  # try 1's host is known only to a live memory
    assert metrics.registry.get_sample_value("dupguard_check_detected_total", {"kind": "double_bump"}) == 1


def test_the_check_does_not_apply_to_the_fixed_versions(pg_templates: Templates) -> None:
    url = pg_templates.clone("3.2.2")
    db = open_airflow_db(make_engine(parse_url(url)))
    try:
        assert "double_bump" not in [c.kind for c in checks.build(Config.of(database_url=url), db, Metrics())]
    finally:
        db.engine.dispose()


def test_the_daemon_alerts_a_bump_once_and_never_remediates(pg_templates: Templates) -> None:
    """`run --once` twice with one ledger (the daemon's own wiring of every check): one notice."""
    url = pg_templates.clone("3.1.2", "double_bump")
    [bump] = ground_truth("3.1.2", "double_bump")["expected_bumps"]
    ledger, metrics, recorder = MemoryLedger(), Metrics(), Recorder()
    first = _daemon(url, recorder, ledger, metrics)
    assert first.run(once=True) == 0
    assert _daemon(url, recorder, ledger, metrics).run(once=True) == 0
    [notice] = [n for n in recorder.notices if n.kind == "double_bump"]
    assert notice.key == f"double_bump:{bump['ti_id']}:1"
    assert first.parts.remediator.actions == []  # type: ignore[attr-defined]

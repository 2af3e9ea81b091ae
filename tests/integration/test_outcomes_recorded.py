"""Every outcome is counted and logged once: a duplicate the planner decides without a
remediation attempt (too late, prevented by the guard, stopped before, remediation off) gives one
``dupguard_remediations_total`` increment and one ``remediation`` line, exactly like an executed one;
``DupguardDuplicateCaughtAfterStart`` and the docs rely on it.

Real daemons, real PostgreSQL with the Airflow-made 3.1.2 scenarios, the real remediator."""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.core.model import GUARD_NOTE_PREFIX
from detector.core.ports import Result
from tests.airflow_server import db_state, sql
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, ground_truth

pytestmark = pytest.mark.integration

LONG_AGO = timedelta(days=3650)  # the look-back reaches the Airflow-made scenario's runs
FAIL_DB = {"remediation": "fail", "remediation_backend": "db", "startup_lookback": LONG_AGO}


def _group(scenario: str, dag_id: str | None = None) -> tuple[str, str]:
    """(kept run_id, duplicate run_id) of the scenario's (first, or ``dag_id``'s) duplicate pair."""
    groups = ground_truth("3.1.2", scenario)["expected_groups"]
    group = next(g for g in groups if dag_id is None or g["dag_id"] == dag_id)
    [dup] = [r for r in group["run_ids"] if r != group["first_run_id"]]
    return group["first_run_id"], dup


def _count(d: Running, mode: str, backend: str, result: str) -> float:
    labels = {"mode": mode, "backend": backend, "result": result}
    return d.metrics.registry.get_sample_value("dupguard_remediations_total", labels) or 0.0


def _lines(logs: list[MutableMapping[str, Any]], run_id: str | None = None) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "remediation" and run_id in (None, e["run_id"])]


def _start(daemons: list[Running], url: str, **settings: Any) -> Running:
    """A real remediator; no takeover wait (each predecessor here stopped cleanly before); a lease of 3 s,
    not the harness's 0.6 s, which a stall under CI load can end mid-write (fenced and retried:
    test_fencing's subject, not these outcomes')."""
    settings = {"leader_check_interval": timedelta(seconds=1)} | settings
    d = start_daemon(url, real_remediation=True, durable=False, takeover_wait=timedelta(0), **settings)
    daemons.append(d)
    return d


def test_too_late_is_counted_and_logged_once(pg_templates: Templates, daemons: list[Running]) -> None:
    """race_asset: Airflow's duplicate had run its extract when it was found (planned too late). The
    page ``DupguardDuplicateCaughtAfterStart`` counts on ``result="too_late"``: one increment, one line."""
    url = pg_templates.clone("3.1.2", "race_asset")
    _, dup = _group("race_asset")
    with capture_logs() as logs:
        d = _start(daemons, url, **FAIL_DB)
        wait_for(lambda: dup in d.alerter.results(), what="the duplicate's outcome")
        time.sleep(0.3)  # later polls must not count it again
    assert d.alerter.results()[dup] == [Result.TOO_LATE]
    assert _count(d, "fail", "db", "too_late") == 1
    [line] = _lines(logs, dup)
    assert line["result"] == "too_late" and line["outcome"] == "too_late" and line["backend"] == "db"
    assert line["detail"].startswith("too late")


def test_prevented_by_the_guard_is_counted_and_logged_once(pg_templates: Templates, daemons: list[Running]) -> None:
    """A duplicate the in-scheduler guard created with every task skipped (its note, as policy.py
    writes it, on an Airflow-made pair): prevented, one ``already`` increment, one line."""
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    kept, dup = _group("race_asset_fanout", "orders_consumer_1")
    pk = db_state(url)[dup].id
    sql(url, "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) VALUES (:pk, :c, now(), now())",
        pk=pk, c=f"{GUARD_NOTE_PREFIX}{kept} (HA scheduler race, apache/airflow#54491)")  # fmt: skip
    sql(url, "UPDATE task_instance SET state='skipped' WHERE run_id=:r", r=dup)
    sql(url, "UPDATE dag_run SET state='success' WHERE run_id=:r", r=dup)
    with capture_logs() as logs:
        d = _start(daemons, url, dags=("orders_consumer_1",), **FAIL_DB)
        wait_for(lambda: dup in d.alerter.results(), what="the duplicate's outcome")
        time.sleep(0.3)
    assert d.alerter.results()[dup] == [Result.ALREADY]
    assert _count(d, "fail", "db", "already") == 1
    [line] = _lines(logs, dup)
    assert line["outcome"] == "prevented" and line["result"] == "already"


def test_stopped_before_is_counted_and_logged_once(pg_templates: Templates, daemons: list[Running]) -> None:
    """A first daemon stops the duplicate (one ``done``); a restarted one without the durable ledger
    judges the group again and finds its note: stopped before, one ``already`` increment, one line."""
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    _, dup = _group("race_asset_fanout", "orders_consumer_1")
    settings = {"dags": ("orders_consumer_1",), **FAIL_DB}
    with capture_logs() as logs:
        first = _start(daemons, url, **settings)
        wait_for(lambda: dup in first.alerter.results(), what="the first stop")
        first.stop()
        daemons.remove(first)
        second = _start(daemons, url, **settings)
        wait_for(lambda: dup in second.alerter.results(), what="the second judgement")
        time.sleep(0.3)
    assert first.alerter.results()[dup] == [Result.DONE] and _count(first, "fail", "db", "done") == 1
    assert second.alerter.results()[dup] == [Result.ALREADY]
    assert _count(second, "fail", "db", "already") == 1
    assert [(e["outcome"], e["result"]) for e in _lines(logs, dup)] == [
        ("remediate", "done"),
        ("stopped_before", "already"),
    ]


def test_remediation_off_counts_each_duplicate_once(pg_templates: Templates, daemons: list[Running]) -> None:
    """Remediation off: each of the three Airflow-made duplicates is one ``skipped`` increment and one
    line, not one per judgement: a restart with the durable ledger counts none again."""
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    dups = {_group("race_asset_fanout", f"orders_consumer_{i}")[1] for i in (1, 2, 3)}
    with capture_logs() as logs:
        first = start_daemon(url, real_remediation=True, remediation="off", startup_lookback=LONG_AGO)
        daemons.append(first)
        wait_for(lambda: len(first.alerter.detected()) == 3, what="three groups")
        time.sleep(0.3)
        assert _count(first, "off", "none", "skipped") == 3
        first.stop()
        daemons.remove(first)
        second = start_daemon(url, real_remediation=True, remediation="off", startup_lookback=LONG_AGO)
        daemons.append(second)
        wait_for(second.is_leader, what="leadership")
        time.sleep(0.5)  # its look-back judges the groups again
    assert _count(second, "off", "none", "skipped") == 0
    assert sorted(e["run_id"] for e in _lines(logs)) == sorted(dups)
    assert {e["outcome"] for e in _lines(logs)} == {"disabled"}


def test_a_storm_bigger_than_the_queue_leaves_nothing_not_attempted(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """One worker and room for one job: of the three groups two wait for room (pending, said so once),
    and every duplicate is still acted on by the same living leader, none reported "not attempted"."""
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    dups = {_group("race_asset_fanout", f"orders_consumer_{i}")[1] for i in (1, 2, 3)}
    with capture_logs() as logs:
        d = _start(daemons, url, dispatch_options={"workers": 1, "queue_size": 1}, **FAIL_DB)
        wait_for(lambda: set(d.alerter.results()) == dups, what="a result for every duplicate")
        time.sleep(0.3)
    assert _count(d, "fail", "db", "failed") == 0
    lines = _lines(logs)
    assert sorted(e["run_id"] for e in lines) == sorted(dups)
    assert not [e for e in lines if "queue full" in e["detail"]]
    assert [e["event"] for e in logs if e["event"].startswith("remediation_deferred")] == ["remediation_deferred"]


def test_an_outcome_alert_keeps_the_detection_time_and_adds_its_own(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """The OUTCOME event carries the group's detection time (was: replaced by the outcome's) and the
    outcome's own: the Slack update and the Alertmanager description show both."""
    url = pg_templates.clone("3.1.2", "race_asset")
    _, dup = _group("race_asset")
    d = _start(daemons, url, **FAIL_DB)
    wait_for(lambda: dup in d.alerter.results(), what="the duplicate's outcome")
    [first] = d.alerter.detected()
    [done] = d.alerter.outcomes()
    assert done.detected_at == first.detected_at
    assert done.outcome_at is not None and done.outcome_at >= first.detected_at
    assert first.outcome_at is None

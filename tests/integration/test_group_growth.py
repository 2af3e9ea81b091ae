"""A group that grows is announced again (never silent): a third run joining a group that was already
alerted is a new duplicate on-call must hear about, in alert-only mode as much as when remediating.
Real PostgreSQL with the real 3.1.2 schema; runs written the way Airflow's scheduler writes them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from detector.actions.alerts.group_text import plain_text
from detector.core.ports import AlertKind
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration


def _named(d: Running, run_id: str) -> bool:
    return any(run_id in {r.run_id for r in e.finding.duplicates} for e in d.alerter.detected())


@pytest.mark.parametrize("durable", [False, True], ids=["memory-ledger", "durable-ledger"])
def test_a_third_run_joining_an_alerted_group_is_alerted(
    durable: bool, pg_templates: Templates, daemons: list[Running]
) -> None:
    """Alert-only: the pair is announced once; a third run of the same asset event joins later and is
    announced in a second detected alert naming it as new; nothing is announced a third time."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    run_after = datetime.now(UTC)
    event = writer.event(run_after - timedelta(milliseconds=5))
    first = writer.run("consumer", run_after, [event], job=1)
    second = writer.run("consumer", run_after, [event], job=2)
    d = start_daemon(url, durable=durable, remediation="off")
    daemons.append(d)
    wait_for(lambda: _named(d, second.run_id), what="the pair announced")
    assert len(d.alerter.detected()) == 1 and d.alerter.detected()[0].new_runs == ()
    third = writer.run("consumer", run_after, [event], job=1)
    wait_for(lambda: _named(d, third.run_id), what="the third run announced")
    time.sleep(0.5)  # a few more polls: no repeat
    detected = d.alerter.detected()
    assert len(detected) == 2
    grown = detected[1]
    assert grown.kind is AlertKind.DETECTED
    assert grown.new_runs == (third.run_id,)
    assert grown.finding.kept.run_id == first.run_id
    assert {r.run_id for r in grown.finding.duplicates} == {second.run_id, third.run_id}
    writer.close()


def test_the_alert_of_a_grown_group_names_the_run_that_joined(pg_templates: Templates, daemons: list[Running]) -> None:
    """A third run that joins with one more event consumed every event of the group, so it is the run
    to keep now (dry-run stopped nothing: no decision is final yet) and the first kept run becomes a
    duplicate. The grown alert names the one run that joined, not the run that changed role (it named
    the old kept run: the count was of duplicates not yet announced, not of runs new to the group)."""
    url = pg_templates.clone("3.1.2")
    writer = AirflowWriter(url)
    run_after = datetime.now(UTC)
    first_event = writer.event(run_after - timedelta(milliseconds=5))
    first = writer.run("consumer", run_after, [first_event], job=1)
    second = writer.run("consumer", run_after, [first_event], job=2)
    d = start_daemon(url, durable=False, remediation="dry-run")
    daemons.append(d)
    wait_for(lambda: _named(d, second.run_id), what="the pair announced")
    later_event = writer.event(run_after - timedelta(milliseconds=2))
    third = writer.run("consumer", run_after, [first_event, later_event], job=1)
    wait_for(lambda: len(d.alerter.detected()) == 2, what="the grown group announced")
    time.sleep(0.5)  # a few more polls: no repeat
    grown = d.alerter.detected()[1]
    assert grown.new_runs == (third.run_id,), (grown.new_runs, first.run_id)
    assert "(group grew: 1 more run)" in plain_text(grown)
    assert len(d.alerter.detected()) == 2
    writer.close()

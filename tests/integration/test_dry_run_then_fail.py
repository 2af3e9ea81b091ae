"""A duplicate found during dry-run and still queued is judged again when the mode changes to fail:
stopped if it still can be, reported too late if it started, never decided twice. Real PostgreSQL with
the real Airflow 3.1.2 schema, the real ``db`` backend, daemons restarted as an operator would after
flipping DUPGUARD_REMEDIATION; the durable ledger and the in-memory one (docs/explanation/remediation.md,
"From dry-run to fail").
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from detector.app.leader import AdvisoryLock
from detector.app.ledger import DbLedger
from detector.core.ports import AlertEvent, Result
from detector.metadb.engine import make_engine, parse_url
from tests.airflow_server import db_state, sql
from tests.daemon_harness import Running, wait_for
from tests.integration.test_keep_final import _pair, _start, _start_task, _stop
from tests.pg import Templates
from tests.writer import Committed

pytestmark = pytest.mark.integration
FAIL = {"remediation": "fail", "remediation_backend": "db"}


def _dry_run(daemons: list[Running], url: str, dup: str, *, durable: bool) -> AlertEvent:
    """A dry-run daemon finds the pair and reports what it would do, then stops (the operator's restart)."""
    d = _start(daemons, url, durable=durable, remediation="dry-run")
    _wait(lambda: d.alerter.results().get(dup) == [Result.DRY_RUN], "the dry run's outcome")
    [detected] = d.alerter.detected()
    _stop(daemons, d)
    return detected


def _found_by_dry_run(
    pg_templates: Templates, daemons: list[Running], *, durable: bool, aged: bool = False
) -> tuple[str, Committed, Committed, AlertEvent]:
    """The race pair, reported by a dry run; ``aged``: then older than a restart's look-back."""
    url = pg_templates.clone("3.1.2")
    _, kept, dup, _, _ = _pair(url)
    found = _dry_run(daemons, url, dup.run_id, durable=durable)
    if aged:
        _age(url, 60)  # the look-back (5 minutes here) no longer reaches the pair
    return url, kept, dup, found


def _results(event: AlertEvent) -> list[tuple[str, Result]]:
    return [(r.action.run.run_id, r.result) for r in event.results]


def _leaves_alone(daemons: list[Running], url: str) -> None:
    """Another fail-mode restart: a new term that alerts nothing and changes nothing."""
    before = db_state(url)
    d = _start(daemons, url, **FAIL)
    _wait(lambda: d.is_leader() and d.detector is not None, "the next term")
    lock = d.daemon.parts.leadership
    assert isinstance(lock, AdvisoryLock)
    time.sleep(lock.takeover_wait.total_seconds() + 3)  # a term's first write waits that long: room for it to land
    assert d.alerter.events == []
    assert db_state(url) == before


def _wait(condition: Callable[[], bool], what: str) -> None:
    wait_for(condition, timeout=40, what=what)  # a new leader waits out the lease before writing


def _age(url: str, minutes: int) -> None:
    """Every run was queued ``minutes`` earlier: older than the look-back of a restarted process."""
    sql(url, "UPDATE dag_run SET queued_at = queued_at - make_interval(mins => :m), "
        "run_after = run_after - make_interval(mins => :m)", m=minutes)  # fmt: skip


def _outcome(d: Running) -> AlertEvent:
    [event] = d.alerter.outcomes()
    return event


def test_durable_ledger_stops_the_queued_duplicate_a_dry_run_found(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    url, kept, dup, found = _found_by_dry_run(pg_templates, daemons, durable=True)
    assert db_state(url)[dup.run_id].state == "queued"
    before = db_state(url)[kept.run_id]

    d = _start(daemons, url, **FAIL)
    _wait(lambda: db_state(url)[dup.run_id].state == "failed", "the duplicate stopped")
    _wait(lambda: bool(d.alerter.outcomes()), "the outcome")
    assert db_state(url)[kept.run_id] == before
    assert d.alerter.detected() == []  # the dry run's incident, updated: not a new one
    event = _outcome(d)
    assert event.finding.kept.run_id == kept.run_id
    assert _results(event) == [(dup.run_id, Result.DONE)]
    assert event.observed_at is not None and event.detected_at == event.observed_at
    assert abs((event.observed_at - found.detected_at).total_seconds()) < 1
    assert event.mode == "fail"


def test_durable_ledger_reports_too_late_and_never_decides_again(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """The duplicate started between the dry run and the restart: too late, reported so. That decision
    is final: once its task is cleared back to queued, a later restart leaves it alone."""
    url, _, dup, _ = _found_by_dry_run(pg_templates, daemons, durable=True)
    _start_task(url, dup.run_id)
    before = db_state(url)

    d = _start(daemons, url, **FAIL)
    _wait(lambda: bool(d.alerter.outcomes()), "the outcome")
    event = _outcome(d)
    assert _results(event) == [(dup.run_id, Result.TOO_LATE)]
    assert event.observed_at is not None
    assert db_state(url) == before
    _stop(daemons, d)

    sql(url, "UPDATE task_instance SET state=NULL, start_date=NULL WHERE run_id=:r", r=dup.run_id)
    _leaves_alone(daemons, url)


def test_memory_ledger_sweeps_the_queued_duplicate_older_than_the_look_back(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    url, kept, dup, _ = _found_by_dry_run(pg_templates, daemons, durable=False, aged=True)
    before = db_state(url)[kept.run_id]

    d = _start(daemons, url, durable=False, **FAIL)
    _wait(lambda: db_state(url)[dup.run_id].state == "failed", "the duplicate stopped")
    _wait(lambda: bool(d.alerter.outcomes()), "the outcome")
    assert db_state(url)[kept.run_id] == before
    [event] = d.alerter.outcomes()
    assert event.finding.kept.run_id == kept.run_id
    assert _results(event) == [(dup.run_id, Result.DONE)]


def test_memory_ledger_reports_too_late_when_the_duplicate_starts_before_the_stop(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """The duplicate's task starts after the sweep judged it, right before the guarded re-read: not stopped."""
    url, kept, dup, _ = _found_by_dry_run(pg_templates, daemons, durable=False, aged=True)

    d = _start(daemons, url, durable=False, task_starts=dup.run_id, **FAIL)
    _wait(lambda: bool(d.alerter.outcomes()), "the outcome")
    event = _outcome(d)
    assert _results(event) == [(dup.run_id, Result.TOO_LATE)]
    state = db_state(url)
    assert state[dup.run_id].state == "queued" and state[dup.run_id].note is None
    assert state[kept.run_id].state == "queued" and state[kept.run_id].note is None


def test_a_group_decided_in_fail_mode_is_not_decided_again(pg_templates: Templates, daemons: list[Running]) -> None:
    """Fail mode stops the duplicate; a later dry-run replica and another fail-mode restart change nothing."""
    url, _, dup, _ = _found_by_dry_run(pg_templates, daemons, durable=True)
    first = _start(daemons, url, **FAIL)
    _wait(lambda: db_state(url)[dup.run_id].state == "failed", "the duplicate stopped")
    _wait(lambda: bool(first.alerter.outcomes()), "the outcome")
    _stop(daemons, first)
    _leaves_alone(daemons, url)


def test_a_duplicate_that_finished_since_the_dry_run_is_not_alerted_again(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """A dry run's finding whose duplicate ran to the end: nothing to stop, and no outcome months later."""
    url, _, dup, _ = _found_by_dry_run(pg_templates, daemons, durable=True)
    sql(url, "UPDATE task_instance SET state='success', start_date=now(), end_date=now() WHERE run_id=:r",
        r=dup.run_id)  # fmt: skip
    sql(url, "UPDATE dag_run SET state='success', start_date=now(), end_date=now() WHERE run_id=:r", r=dup.run_id)
    _leaves_alone(daemons, url)


def test_a_dry_run_finding_already_decided_elsewhere_is_left_as_decided(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    """The group's decision claim was taken by another leader (its poll in mode fail, or a pick-up that
    died before clearing the observation): the observation decides nothing more."""
    url, _, dup, found = _found_by_dry_run(pg_templates, daemons, durable=True)
    sql(url, "INSERT INTO dupguard.claims (group_key, subject, claimed_at, owner) "
        "VALUES (:k, :s, now(), 'another-leader')", k=found.finding.key, s=f"action:{dup.run_id}")  # fmt: skip
    _leaves_alone(daemons, url)
    engine = make_engine(parse_url(url))
    try:
        assert DbLedger(engine).observed() == []  # dropped: not judged at every term again
    finally:
        engine.dispose()

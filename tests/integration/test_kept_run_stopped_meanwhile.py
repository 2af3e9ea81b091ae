"""Never both runs of a group: a duplicate is left alone once its kept run was stopped after the keep
decision (the CI failure of 2026-12-01's fencing trials).

The case: a deposed leader's write lands late and stops the run a new leader keeps (each judged from
what it had read); or an operator fails the kept run by hand. The duplicate's own re-read finds nothing
wrong with the duplicate, so only a re-read of the kept run can refuse. Real schema and a group
Airflow's scheduler code made (3.1.2 ``race_asset_fanout``); the ``db`` backend here (its check holds
the kept run's row until the commit), the ``api`` backend in ``test_fencing.py``; truth from
``dag_run``/``task_instance``/``dag_run_note``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import pytest

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.model import Finding, Run
from detector.core.plan import Action, Mode, Outcome, note_for
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.pg import Templates

pytestmark = pytest.mark.integration


def _stop(finding: Finding, target: Run, kept: Run, now: datetime) -> Action:
    return Action(
        finding.key, finding.dag_id, target, kept.run_id, Outcome.REMEDIATE, Mode.FAIL, note_for(finding, target, now)
    )


@pytest.fixture
def group(pg_templates: Templates) -> Iterator[tuple[str, GuardedRemediator, Finding]]:
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        finding = next(f for f in scan(db, now=datetime.now(UTC)).findings if f.duplicates)
        settings = Config.of(database_url=url, remediation="fail", remediation_backend="db")
        remediator = build_remediator(settings, engine, db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        yield url, remediator, finding
    finally:
        engine.dispose()


def _by_reversed_judgement(url: str, remediator: GuardedRemediator, finding: Finding) -> None:
    """The deposed leader's late write: the kept run stopped as a duplicate of the duplicate."""
    [dup] = finding.duplicates
    result = remediator.execute(_stop(finding, finding.kept, dup, datetime.now(UTC)))
    assert result.result is Result.DONE, result.detail


def _by_hand(url: str, remediator: GuardedRemediator, finding: Finding) -> None:
    """An operator failed the kept run before it ran (no note): Airflow skips its unfinished tasks."""
    kept = finding.kept
    sql(url, "UPDATE dag_run SET state = 'failed', end_date = now() WHERE id = :id", id=kept.id)
    sql(
        url,
        "UPDATE task_instance SET state = 'skipped' WHERE dag_id = :d AND run_id = :r",
        d=kept.dag_id,
        r=kept.run_id,
    )


def _deleted(url: str, remediator: GuardedRemediator, finding: Finding) -> None:
    kept = finding.kept
    sql(url, "DELETE FROM task_instance WHERE dag_id = :d AND run_id = :r", d=kept.dag_id, r=kept.run_id)
    sql(url, "DELETE FROM dag_run WHERE id = :id", id=kept.id)


@pytest.mark.parametrize(
    ("stop_kept", "why"),
    [
        (_by_reversed_judgement, "was stopped as a duplicate"),
        (_by_hand, "stopped before any task ran"),
        (_deleted, "no longer exists"),
    ],
    ids=["late-write-of-a-deposed-leader", "failed-by-hand", "deleted"],
)
def test_a_duplicate_whose_kept_run_was_stopped_meanwhile_is_left_alone(
    group: tuple[str, GuardedRemediator, Finding],
    stop_kept: Callable[[str, GuardedRemediator, Finding], None],
    why: str,
) -> None:
    url, remediator, finding = group
    [dup] = finding.duplicates
    action = _stop(finding, dup, finding.kept, datetime.now(UTC))
    stop_kept(url, remediator, finding)
    before = db_state(url)
    assert before[dup.run_id].state == "queued" and before[dup.run_id].note is None

    result = remediator.execute(action)

    assert result.result is Result.SKIPPED and why in result.detail, result.detail
    assert not result.retryable
    assert db_state(url) == before  # the duplicate untouched: one run of the group stays to do the work


def test_a_kept_run_that_ran_and_failed_on_its_own_does_not_protect_its_duplicate(
    group: tuple[str, GuardedRemediator, Finding],
) -> None:
    """The refusal is not a blanket one: a kept run whose task ran (a worker's pid on it) and failed did
    the group's work; its duplicate is stopped as usual."""
    url, remediator, finding = group
    kept, [dup] = finding.kept, finding.duplicates
    sql(
        url,
        "UPDATE task_instance SET state = 'failed', pid = 4242 WHERE dag_id = :d AND run_id = :r",
        d=kept.dag_id,
        r=kept.run_id,
    )
    sql(url, "UPDATE dag_run SET state = 'failed', end_date = now() WHERE id = :id", id=kept.id)

    result = remediator.execute(_stop(finding, dup, kept, datetime.now(UTC)))

    assert result.result is Result.DONE, result.detail
    after = db_state(url)[dup.run_id]
    assert after.state == "failed" and (after.note or "").startswith("dupguard stopped")

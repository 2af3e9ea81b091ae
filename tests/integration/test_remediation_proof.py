"""Proof behind every ``done``, backend ``db`` on a real Airflow 3.1.2 schema.

The duplicates are Airflow-made (``race_asset_fanout``); a task's earlier life is written as Airflow
records it (its state, and the ``pid`` / ``last_heartbeat_at`` a worker's ``ti_run`` stamps). Whatever
the result says is checked against what Airflow recorded afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from detector.app.ledger import MemoryLedger
from detector.config import Config
from detector.core.plan import Mode, Outcome
from detector.core.ports import Result
from detector.metrics import Metrics
from detector.sources.database.source import DatabaseSource
from tests.airflow_server import db_state, sql
from tests.integration.test_remediation_db import Db

pytestmark = pytest.mark.integration


# (state, pid) of ``extract`` as Airflow leaves it: a try that ran and waits to retry, a task cleared
# while running, one waiting for a human (HITL), one that finished, and one back in ``scheduled`` for
# its second try (the first try's worker pid stays on the row: prepare_db_for_next_try keeps it).
RAN_BEFORE = [
    ("up_for_retry", 4242),
    ("restarting", 4242),
    ("awaiting_input", 4242),
    ("success", 4242),
    ("failed", 4242),
    ("scheduled", 4242),
]


@pytest.mark.parametrize(("state", "pid"), RAN_BEFORE, ids=[s for s, _ in RAN_BEFORE])
def test_with_remediate_started_a_task_that_had_run_is_never_done(fanout: Db, state: str, pid: int) -> None:
    """DUPGUARD_REMEDIATE_STARTED=true: the duplicate is stopped, and because ``extract`` had run (as
    Airflow recorded it) the result is ``caught_after_start`` naming it, counted so, never ``done``."""
    action = fanout.actions(Mode.FAIL)[0]
    # both runs of the group ran extract (as in race_asset), so the keep rule still keeps the lower id
    sql(
        fanout.url,
        "UPDATE task_instance SET state=:s, pid=:p, last_heartbeat_at=now(), start_date=now(), try_number=1 "
        "WHERE run_id IN (:r, :k) AND task_id='extract'",
        s=state,
        p=pid,
        r=action.run.run_id,
        k=action.kept_run_id,
    )
    assert fanout.remediator(Mode.FAIL).execute(action).result is Result.TOO_LATE
    (forced,) = [a for a in fanout.actions(Mode.FAIL, remediate_started=True) if a.run.run_id == action.run.run_id]
    remediator = fanout.remediator(Mode.FAIL, remediate_started=True)
    result = remediator.execute(forced)

    row = db_state(fanout.url)[action.run.run_id]  # what Airflow now records
    assert row.state == "failed" and row.tasks["load"][0] == "skipped"
    assert result.result is Result.CAUGHT_AFTER_START, result.detail
    assert [(t.name, t.before) for t in result.started_tasks] == [("extract", state)]
    assert remediator.metrics is not None
    labels = {"mode": "fail", "backend": "db"}
    registry = remediator.metrics.registry
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "caught_after_start"}) == 1
    assert registry.get_sample_value("dupguard_remediations_total", labels | {"result": "done"}) is None


# --- a note is not proof ----------------------------------------------------------------------------


def _note(url: str, run_id: str, content: str) -> None:
    """A note on a run as an operator types it in the UI (or a copy of dupguard's from another run)."""
    sql(
        url,
        "INSERT INTO dag_run_note (dag_run_id, user_id, content, created_at, updated_at) "
        "SELECT id, 'admin', :c, now(), now() FROM dag_run WHERE run_id=:r",
        c=content,
        r=run_id,
    )


def test_a_note_in_dupguards_words_on_a_queued_run_is_judged_afresh_and_the_run_stopped(fanout: Db) -> None:
    """The duplicate is still queued with no task skipped, yet carries dupguard's words (a copied note):
    not ``already`` while both runs go on, but judged afresh and stopped by the db backend."""
    action = fanout.actions(Mode.FAIL)[0]
    _note(fanout.url, action.run.run_id, action.note)
    (again,) = [a for a in fanout.actions(Mode.FAIL) if a.run.run_id == action.run.run_id]
    assert again.outcome is Outcome.REMEDIATE and again.kept_run_id == action.kept_run_id
    result = fanout.remediator(Mode.FAIL).execute(again)
    assert result.result is Result.DONE, result.detail
    rows = db_state(fanout.url)
    assert rows[action.run.run_id].state == "failed" and rows[action.kept_run_id].state == "queued"


def test_notes_on_both_runs_naming_each_other_still_resolve_the_group(fanout: Db) -> None:
    """Both queued runs carry a note in dupguard's words naming the other as kept: neither is a
    decision, the group is judged afresh (lowest id kept) and its duplicate stopped."""
    action = fanout.actions(Mode.FAIL)[0]
    finding_key = action.finding_key
    _note(fanout.url, action.run.run_id, action.note)
    _note(fanout.url, action.kept_run_id, action.note.replace(action.kept_run_id, action.run.run_id))
    planned = [a for a in fanout.actions(Mode.FAIL) if a.finding_key == finding_key]
    assert [(a.run.run_id, a.kept_run_id, a.outcome) for a in planned] == [
        (action.run.run_id, action.kept_run_id, Outcome.REMEDIATE)
    ]
    assert fanout.remediator(Mode.FAIL).execute(planned[0]).result is Result.DONE


def test_the_database_source_logs_a_note_that_disagrees(fanout: Db) -> None:
    """The daemon's path (PriorDecisions on the poll connection): one ``note_disagrees`` line naming
    the run, and the run is not counted as stopped."""
    action = fanout.actions(Mode.FAIL)[0]
    _note(fanout.url, action.run.run_id, action.note)
    source = DatabaseSource(Config.of(database_url=fanout.url), fanout.db, MemoryLedger(), Metrics())
    try:
        with capture_logs() as logs:
            findings = source.rejudge(action.dag_id, action.run.run_id, datetime.now(UTC))
    finally:
        source.close()
    assert findings is not None
    (finding,) = [f for f in findings if f.key == action.finding_key]
    assert finding.prior.stopped == frozenset() and finding.kept.run_id == action.kept_run_id
    lines = [e for e in logs if e["event"] == "note_disagrees"]
    assert [(e["run_id"], e["run_state"]) for e in lines] == [(action.run.run_id, "queued")]

"""``PriorDecisions`` (the database source's earlier decisions): a kept role in the ledger wins over a
note in dupguard's words on the same run, even where Airflow's record agrees with the note (the run
failed), on a real PostgreSQL with the Airflow 3.1.2 schema."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from detector.app.ledger import MemoryLedger
from detector.core.plan import Mode
from detector.metadb import consumption
from detector.sources.database.prior import PriorDecisions
from tests.airflow_server import sql
from tests.integration.test_remediation_db import Db
from tests.integration.test_remediation_proof import _note

pytestmark = pytest.mark.integration


def test_a_run_the_ledger_kept_is_not_stopped_by_a_note_on_it(fanout: Db) -> None:
    """The run failed and carries dupguard's note (copied from its duplicate); the ledger recorded it
    kept: it stays kept, and the note is disputed, not a decision that it was stopped."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, "UPDATE dag_run SET state='failed' WHERE run_id=:r", r=action.run.run_id)
    _note(fanout.url, action.run.run_id, action.note)
    failed = replace(action.run, state="failed")
    ledger = MemoryLedger()
    ledger.record_decision((failed.dag_id, failed.run_id), [])
    with fanout.engine.connect() as conn:
        progress, notes = consumption.progress_and_notes(conn, fanout.db.tables, [failed.id], datetime.now(UTC))
        assert failed.id in notes  # read with the task progress, as the poll does
        prior = PriorDecisions(fanout.db.tables, ledger)(conn, [failed], progress, notes)
    assert prior.kept == {failed.id} and prior.stopped == frozenset() and prior.disputed == {failed.id}

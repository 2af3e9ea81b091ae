"""A stop that half landed is finished, not taken for ``already`` (found by the fencing trials).

Airflow 3.0.6-3.2.2's set-failed skips each unfinished task in a session of its own
(``mark_tasks.set_dag_run_state_to_failed``: ``ti.set_state(SKIPPED)`` without the request's session;
3.3.2 passes it), so a PATCH whose request then fails leaves every task skipped, the run queued and
no note: nothing records that dupguard stopped it, and a new leader with the in-memory ledger has no
evidence of the decision. In fail mode the next attempt fails the run and writes the note.
That state is made here as Airflow's separate sessions leave it (the skips committed, nothing else);
the ``api`` backend's case, through Airflow's own PATCH, is in ``test_fencing.py``.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Mode, Outcome, plan
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.pg import Templates

pytestmark = pytest.mark.integration


def skip_every_task(url: str, dag_id: str, run_id: str) -> None:
    """What set-failed's own sessions commit before its request fails: the skips, nothing else."""
    sql(
        url,
        "UPDATE task_instance SET state = 'skipped', start_date = now(), end_date = now(), duration = 0 "
        "WHERE dag_id = :d AND run_id = :r",
        d=dag_id,
        r=run_id,
    )


def test_fail_mode_finishes_a_stop_whose_skips_landed_without_the_run_state_and_note(pg_templates: Templates) -> None:
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        action = next(a for a in plan(scan(db, now=now).findings, Mode.FAIL, now=now) if a.outcome is Outcome.REMEDIATE)
        settings = Config.of(database_url=url, remediation="fail", remediation_backend="db")
        remediator = build_remediator(settings, engine, db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        skip_every_task(url, action.dag_id, action.run.run_id)
        before = db_state(url)
        assert before[action.run.run_id].state == "queued" and before[action.run.run_id].note is None

        result = remediator.execute(action)

        assert result.result is Result.DONE and result.detail == "run -> failed", result.detail
        after = db_state(url)
        dup, kept = after[action.run.run_id], after[action.kept_run_id]
        assert dup.state == "failed" and dup.note == action.note
        assert dup.tasks == before[action.run.run_id].tasks  # the skipped tasks are left as they were
        assert kept == before[action.kept_run_id]
    finally:
        engine.dispose()

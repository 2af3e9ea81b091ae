"""The remediation guard's last refusal: never a write on the kept run (benchmarks/results/mutation.md).

``plan`` never targets the kept run, so only an action built by hand reaches this refusal; deleting it
survived a unit-only mutation run. Here the action names the kept run of a group Airflow's own
scheduler code made (3.1.2 ``race_asset_fanout``), on the ``db`` backend against the real schema, and
the database must show that nothing was written.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, Outcome, note_for
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state
from tests.pg import Templates

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("mode", [Mode.FAIL, Mode.SKIP])
def test_an_action_on_the_kept_run_is_refused_and_writes_nothing(pg_templates: Templates, mode: Mode) -> None:
    """An action whose target is the group's kept run (outcome ``remediate``, the configured mode) is
    reported failed as a refusal; every run, task instance and note is as it was."""
    url = pg_templates.clone("3.1.2", "race_asset_fanout")
    engine = make_engine(parse_url(url))
    try:
        db = open_airflow_db(engine)
        now = datetime.now(UTC)
        finding = next(f for f in scan(db, now=now).findings if f.duplicates)
        kept = finding.kept
        note = note_for(finding, kept, now)
        action = Action(finding.key, finding.dag_id, kept, kept.run_id, Outcome.REMEDIATE, mode, note)
        settings = Config.of(database_url=url, remediation=mode.value, remediation_backend="db")
        remediator = build_remediator(settings, engine, db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        before = db_state(url)
        assert before[kept.run_id].state == "queued" and before[kept.run_id].note is None

        result = remediator.execute(action)

        assert result.result is Result.FAILED and "refused" in result.detail
        assert not result.retryable  # a refusal never passes by retrying
        assert db_state(url) == before
    finally:
        engine.dispose()

"""The remediation guard's dry run, pinned where mutation testing found it unpinned
(benchmarks/results/mutation.md): what it reports and logs for each duplicate, judged on a group Airflow's own
scheduler code made (3.1.2 ``race_asset_fanout``) on the real schema, and that it writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from structlog.testing import capture_logs

from detector.actions.remediation.guarded import GuardedRemediator
from detector.app.scan import scan
from detector.app.wiring import build_remediator
from detector.config import Config
from detector.core.plan import Action, Mode, Outcome, plan
from detector.core.ports import Result
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.airflow_server import db_state, sql
from tests.pg import Templates

pytestmark = pytest.mark.integration


class Fanout:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(parse_url(url))
        self.db = open_airflow_db(self.engine)

    def actions(self) -> list[Action]:
        now = datetime.now(UTC)
        return plan(scan(self.db, now=now).findings, Mode.DRY_RUN, now=now)

    def remediator(self, **overrides: Any) -> GuardedRemediator:
        settings = Config.of(database_url=self.url, remediation="dry-run", **overrides)
        remediator = build_remediator(settings, self.engine, self.db.tables, Metrics())
        assert isinstance(remediator, GuardedRemediator)
        return remediator


@pytest.fixture
def fanout(pg_templates: Templates) -> Iterator[Fanout]:
    db = Fanout(pg_templates.clone("3.1.2", "race_asset_fanout"))
    yield db
    db.engine.dispose()


def _would(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] in ("would_fail_run", "would_skip_tasks")]


def test_a_dry_run_says_it_would_fail_each_duplicate_and_logs_what_it_would_write(fanout: Fanout) -> None:
    """One "would_fail_run" line per duplicate naming the run, the kept run, the group, the changes
    and the note it would write; the result says the same; nothing is written."""
    actions = fanout.actions()
    assert actions and all(a.outcome is Outcome.WOULD_REMEDIATE for a in actions)
    before = db_state(fanout.url)
    with capture_logs() as logs:
        results = [fanout.remediator().execute(a) for a in actions]
    assert db_state(fanout.url) == before
    assert [r.result for r in results] == [Result.DRY_RUN] * len(actions)
    assert {r.detail for r in results} == {"would fail the run: run -> failed; skipped: extract, load"}
    lines = _would(logs)
    assert [e["event"] for e in lines] == ["would_fail_run"] * len(actions)
    for action, line in zip(actions, lines, strict=True):
        assert (line["dag_id"], line["run_id"], line["kept_run_id"]) == (
            action.dag_id,
            action.run.run_id,
            action.kept_run_id,
        )
        assert line["finding_key"] == action.finding_key and line["note"] == action.note
        assert line["changes"] == "run -> failed; skipped: extract, load"
        assert line["reason"] == "confirmed duplicate of the kept run (same asset trigger)"


def test_a_skip_action_without_a_backend_says_it_would_skip_the_tasks(fanout: Fanout) -> None:
    """A planned ``skip`` reaching a remediator that has no backend is carried out as a dry run of
    that mode: the tasks would be skipped, the run left as it is."""
    action = replace(fanout.actions()[0], outcome=Outcome.REMEDIATE, mode=Mode.SKIP)
    before = db_state(fanout.url)
    with capture_logs() as logs:
        result = fanout.remediator().execute(action)
    assert (result.result, result.detail) == (Result.DRY_RUN, "would skip its tasks: skipped: extract, load")
    [line] = _would(logs)
    assert line["event"] == "would_skip_tasks" and line["changes"] == "skipped: extract, load"
    assert db_state(fanout.url) == before


def test_a_dry_run_judges_a_started_duplicate_as_the_real_run_would(fanout: Fanout) -> None:
    """Its task is running: too late, unless the operator opted in to stopping started duplicates,
    when the dry run says it would fail that task."""
    action = fanout.actions()[0]
    sql(
        fanout.url,
        "UPDATE task_instance SET state='running', start_date=now() WHERE run_id=:r AND task_id='extract'",
        r=action.run.run_id,
    )
    late = fanout.remediator().execute(action)
    assert late.result is Result.TOO_LATE and "extract=running" in late.detail
    opted_in = fanout.remediator(remediate_started=True).execute(action)
    assert opted_in.result is Result.DRY_RUN
    assert opted_in.detail == "would fail the run: run -> failed; skipped: load; failed: extract"


def test_a_dry_run_with_nothing_to_read_from_is_skipped_as_off(fanout: Fanout) -> None:
    """With remediation off nothing is even read: a dry-run action that reaches it is skipped."""
    off = build_remediator(Config.of(database_url=fanout.url, remediation="off"), None, None, Metrics())
    assert isinstance(off, GuardedRemediator)
    result = off.execute(fanout.actions()[0])
    assert (result.result, result.detail) == (Result.SKIPPED, "remediation is off")

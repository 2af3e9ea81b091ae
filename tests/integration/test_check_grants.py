"""A periodic check whose tables the role may not read (the duplicate-detection grant of 0.x, before issue
25's checks): one ``check_not_permitted`` line per check naming the table, a failure counted per run, never
a crash, and ``check_permitted`` once the grant is there (real PostgreSQL, a real login role)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.app.ledger import MemoryLedger
from detector.checks import enabled as checks
from detector.checks.runner import CheckRunner
from detector.config import Config
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metrics import Metrics
from tests.pg import Templates, execute_admin

pytestmark = pytest.mark.integration
OLD_GRANT = "GRANT SELECT ON alembic_version, dag_run, task_instance, dagrun_asset_event, asset_event, asset, job, dag_run_note TO {role}"  # noqa: E501


class Recorder:
    def __init__(self) -> None:
        self.notices: list[object] = []

    def notify_notice(self, notice: object) -> None:
        self.notices.append(notice)


@pytest.fixture
def role() -> Iterator[str]:
    name = f"dg_chk_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{name}" LOGIN')
    yield name
    execute_admin(f'DROP ROLE IF EXISTS "{name}"')


def test_a_check_without_its_grant_says_so_once_and_recovers(pg_templates: Templates, role: str) -> None:
    url = pg_templates.clone("3.1.2", "race_asset")
    dbname = make_url(url).database
    execute_admin(OLD_GRANT.format(role=f'"{role}"'), dbname=dbname)
    as_role = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        db = open_airflow_db(make_engine(parse_url(as_role)))
        metrics = Metrics()
        config = Config.of(database_url=as_role, disabled_checks=("stranded_events", "double_bump"))
        runner = CheckRunner(db, checks.build(config, db, metrics), MemoryLedger(), Recorder(), metrics, cluster="c")
        assert list(runner.checks) == ["trigger_flapping"]
        now = datetime.now(UTC)
        with capture_logs() as logged:
            assert runner.run_reported("trigger_flapping", now) is False
            assert runner.run_reported("trigger_flapping", now) is False
        said = [e for e in logged if e["event"] == "check_not_permitted"]
        assert len(said) == 1 and said[0]["kind"] == "trigger_flapping"
        assert "permission denied for table" in said[0]["error"]
        assert "docs/how-to/deploy-kubernetes.md, section 2: Database role" in said[0]["detail"]
        failures = metrics.registry.get_sample_value("dupguard_check_failures_total", {"kind": "trigger_flapping"})
        assert failures == 2
        execute_admin(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"', dbname=dbname)
        with capture_logs() as logged:
            assert runner.run_reported("trigger_flapping", now) is True
        assert [e["event"] for e in logged if e["event"].startswith("check_")] == ["check_permitted"]
        db.engine.dispose()
    finally:
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)

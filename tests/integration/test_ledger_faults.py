"""A durable ledger broken under a running leader (a table dropped, a column renamed, INSERT revoked), on a real
PostgreSQL with the real Airflow 3.1.2 schema. Whatever breaks: the next duplicate is still detected and
alerted (saying the alert may repeat); nothing is remediated while its claim cannot be recorded; one
``ledger_fault`` line (not one per poll) and the health reason say what is broken and what repairs it;
a missing table is re-created by the daemon itself, and once the ledger records again the duplicate is
stopped, once, and not alerted again. (A full volume: test_full_ledger.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from detector.app.ledger import init_db
from detector.core.ports import AlertKind
from detector.metadb.engine import make_engine, parse_url
from tests.daemon_harness import Running, start_daemon, wait_for
from tests.pg import Templates, execute_admin
from tests.writer import AirflowWriter

pytestmark = pytest.mark.integration
DUPGUARD = str(Path(sys.executable).parent / "dupguard")


def _polls_failed(d: Running) -> float:
    return d.metrics.registry.get_sample_value("dupguard_poll_errors_total") or 0.0


def _faults(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "ledger_fault"]


def _drive(url: str, d: Running, *, broken_while: Callable[[], None]) -> tuple[str, str]:
    """A duplicate pair while the ledger is broken: alerted at once saying it may repeat, not
    remediated while the poll is retried; then ``broken_while`` (checks, repair); then stopped once.
    ``url``: where the scheduler stand-in commits the pair. Returns (kept, duplicate) run ids."""
    writer = AirflowWriter(url)
    try:
        kept, duplicate = writer.duplicate_pair("consumer", gap=timedelta(0))
        wait_for(lambda: bool(d.alerter.detected()), timeout=30, what="the alert while the ledger is broken")
        [alert] = d.alerter.events
        assert alert.kind is AlertKind.DETECTED and {r.run_id for r in alert.finding.duplicates} == {duplicate.run_id}
        assert alert.unrecorded, "the alert says it may repeat: the ledger could not record it"
        broken_while()
        wait_for(lambda: bool(d.remediator.actions), timeout=60, what="the remediation once the ledger records")
        wait_for(lambda: d.daemon.ready()[0], timeout=30, what="/readyz green again")
    finally:
        writer.close()
    assert [a.run.run_id for a in d.remediator.actions] == [duplicate.run_id]
    assert [e.kind for e in d.alerter.events if e.kind is AlertKind.DETECTED] == [AlertKind.DETECTED]
    return kept.run_id, duplicate.run_id


def _leading(url: str, daemons: list[Running], **overrides: Any) -> Running:
    d = start_daemon(url, durable=True, remediation="fail", takeover_wait=timedelta(0), **overrides)
    daemons.append(d)
    wait_for(lambda: d.is_leader() and d.detector is not None, what="the only replica to lead and watch")
    return d


def test_a_dropped_claims_table_is_re_created_and_holds_no_alert_back(
    pg_templates: Templates, daemons: list[Running]
) -> None:
    url = pg_templates.clone("3.1.2")
    d = _leading(url, daemons)
    with capture_logs() as logs:
        execute_admin("DROP TABLE dupguard.claims", dbname=str(make_url(url).database))
        _drive(url, d, broken_while=lambda: None)  # no one repairs it but the daemon
    [fault] = _faults(logs)
    assert fault["table"] == "claims" and fault["kind"] == "missing", fault
    assert [e for e in logs if e["event"] == "ledger_repaired"], "the daemon said it re-created the table"
    engine = make_engine(parse_url(url))
    try:
        assert inspect(engine).has_table("claims", schema="dupguard")
    finally:
        engine.dispose()


def test_a_renamed_column_names_init_db_which_repairs_it(pg_templates: Templates, daemons: list[Running]) -> None:
    url = pg_templates.clone("3.1.2")
    dbname = str(make_url(url).database)
    d = _leading(url, daemons)

    def while_broken() -> None:
        failed = _polls_failed(d)
        wait_for(lambda: _polls_failed(d) >= failed + 3, timeout=60, what="the poll failing and retried")
        assert d.remediator.actions == [], "nothing is remediated without its claim"
        up, reason = d.daemon.ready()
        assert not up and "dupguard.claims" in reason and "dupguard init-db" in reason, reason
        assert d.metrics.registry.get_sample_value("dupguard_ledger_fault", {"kind": "altered"}) == 1
        clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")}
        done = subprocess.run(
            [DUPGUARD, "init-db", "--database-url", url], env=clean, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr

    with capture_logs() as logs:
        execute_admin("ALTER TABLE dupguard.claims RENAME COLUMN subject TO what", dbname=dbname)
        _drive(url, d, broken_while=while_broken)
    [fault] = _faults(logs)
    assert fault["table"] == "claims" and fault["kind"] == "altered" and "dupguard init-db" in fault["repair"]
    assert d.metrics.registry.get_sample_value("dupguard_ledger_fault", {"kind": "altered"}) == 0


@pytest.fixture
def role_grants() -> Iterator[tuple[str, list[str]]]:
    """A login role, and the databases it was granted something in (its grants go before it does)."""
    name, granted_in = f"dg_rw_{uuid.uuid4().hex[:8]}", list[str]()
    execute_admin(f'CREATE ROLE "{name}" LOGIN')
    yield name, granted_in
    for dbname in granted_in:
        execute_admin(f'DROP OWNED BY "{name}"', dbname=dbname)
    execute_admin(f'DROP ROLE "{name}"')


def test_revoked_insert_names_the_grant_and_recovers_once_granted(
    pg_templates: Templates, role_grants: tuple[str, list[str]], daemons: list[Running]
) -> None:
    url = pg_templates.clone("3.1.2")
    dbname = str(make_url(url).database)
    writer_role, granted_in = role_grants
    granted_in.append(dbname)
    admin = make_engine(parse_url(url))
    init_db(admin)
    admin.dispose()
    for grant in (
        f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{writer_role}"',
        f'GRANT USAGE ON SCHEMA dupguard TO "{writer_role}"',
        f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA dupguard TO "{writer_role}"',
    ):
        execute_admin(grant, dbname=dbname)
    role_url = make_url(url).set(username=writer_role, password=None).render_as_string(hide_password=False)
    d = _leading(role_url, daemons)

    def while_broken() -> None:
        failed = _polls_failed(d)
        wait_for(lambda: _polls_failed(d) >= failed + 3, timeout=60, what="the poll failing and retried")
        assert d.remediator.actions == [], "nothing is remediated without its claim"
        up, reason = d.daemon.ready()
        assert not up and "permission denied" in reason and "GRANT" in reason, reason
        assert d.metrics.registry.get_sample_value("dupguard_ledger_fault", {"kind": "unwritable"}) == 1
        execute_admin(f'GRANT INSERT ON ALL TABLES IN SCHEMA dupguard TO "{writer_role}"', dbname=dbname)

    with capture_logs() as logs:
        execute_admin(f'REVOKE INSERT ON ALL TABLES IN SCHEMA dupguard FROM "{writer_role}"', dbname=dbname)
        _drive(url, d, broken_while=while_broken)
    [fault] = _faults(logs)
    assert fault["kind"] == "unwritable" and "GRANT" in fault["repair"], fault
    assert [e for e in logs if e["event"] == "ledger_recovered"], "the recovery is logged once"

"""The guard's reads of the metadata database (``DbRunStates``), pinned where mutation testing found
them unpinned (benchmarks/results/mutation.md): the note a write is read back by (the ``api`` backend
proves its own write by it), and the refusal of each read on a hot standby, whole, since it is what
the result and the log tell the operator. Real PostgreSQL, Airflow 3.1.2's schema with a duplicate
pair made by its scheduler code, and a real streaming replica (tests/pg_replica.py).
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.engine import make_url

from detector.actions.remediation.db import DbBackend
from detector.actions.remediation.guarded import DbRunStates, Verdict, Work
from detector.core.plan import Mode
from detector.errors import DatabaseError
from detector.metadb.engine import make_engine, open_airflow_db, parse_url, redact
from tests.airflow_server import sql
from tests.integration.test_grants import documented_grants
from tests.integration.test_remediation_db import Db
from tests.pg import ROOT, Templates, execute_admin
from tests.pg_replica import Replica

pytestmark = pytest.mark.integration

NOTE = "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) VALUES (:i, :c, now(), now())"


def _states(db: Db) -> DbRunStates:
    return DbRunStates(db.engine, db.db.tables)


def test_note_is_the_duplicates_own_note(fanout: Db) -> None:
    """What ``note`` returns is the note on the action's run, not on its kept run nor on another
    group's run; None while the run has none."""
    first, second = fanout.actions(Mode.FAIL)[:2]
    states = _states(fanout)
    assert states.note(first) is None
    sql(fanout.url, NOTE, i=first.run.id, c="on the duplicate")
    sql(fanout.url, NOTE, i=second.run.id, c="on another group's duplicate")
    kept = states.kept(first)
    assert kept is not None
    sql(fanout.url, NOTE, i=kept.state.id, c="on the kept run")
    assert states.note(first) == "on the duplicate"
    assert states.note(second) == "on another group's duplicate"


def test_note_of_a_deleted_run_is_none(fanout: Db) -> None:
    """A run deleted after the write (its note goes with it in Airflow): nothing to read back."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, NOTE, i=action.run.id, c="written")
    sql(fanout.url, "DELETE FROM dag_run WHERE id = :i", i=action.run.id)
    assert _states(fanout).note(action) is None


def test_every_read_works_with_the_documented_read_only_grant(fanout: Db) -> None:
    """Dry-run and the ``api`` backend need no write grant (docs/how-to/deploy-kubernetes.md): the re-reads of the
    duplicate and
    of its kept run and the note read back take no row lock (FOR SHARE needs UPDATE)."""
    action = fanout.actions(Mode.FAIL)[0]
    sql(fanout.url, NOTE, i=action.run.id, c="written")
    role = f"dg_ro_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{role}" LOGIN')
    url = make_url(fanout.url)
    assert url.database is not None
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")["3.0 and 3.1"].replace(
        "TO dupguard;", f'TO "{role}";'
    )
    execute_admin(grant, dbname=url.database)
    engine = make_engine(parse_url(url.set(username=role, password=None).render_as_string(hide_password=False)))
    try:
        states = DbRunStates(engine, fanout.db.tables)
        state, kept = states.state(action), states.kept(action)
        assert state is not None and state.run_id == action.run.run_id
        assert kept is not None and kept.state.run_id == action.kept_run_id and kept.note is None
        assert states.note(action) == "written"
    finally:
        engine.dispose()
        execute_admin(f'DROP OWNED BY "{role}"', dbname=url.database)
        execute_admin(f'DROP ROLE "{role}"')


def test_every_read_refuses_a_hot_standby_and_says_what_it_was_for(pg_templates: Templates, replica: Replica) -> None:
    """Each read names what it was about to do and the setting to change: the operator reads it in
    the result and the ``remediation`` line."""
    primary = Db(pg_templates.clone("3.1.2", "race_asset_fanout"))
    try:
        action = primary.actions(Mode.FAIL)[0]
        replica.wait_caught_up()
        standby_url = replica.url(primary.url)
        engine = make_engine(parse_url(standby_url))
        try:
            states = DbRunStates(engine, open_airflow_db(engine).tables)
            reads = {"state": states.state, "note": states.note, "kept": states.kept}
            for name, use in (
                ("state", "re-reads a run before a write"),
                ("note", "reads a write back"),
                ("kept", "re-reads the kept run before a write"),
            ):
                with pytest.raises(DatabaseError) as refused:
                    reads[name](action)
                assert str(refused.value) == (
                    f"database {redact(engine.url)} is a hot standby (in recovery, it may lag the primary): "
                    f"dupguard never {use} there; set DUPGUARD_DATABASE_URL to the primary (a writer endpoint, "
                    "not a reader endpoint; a multi-host URL needs target_session_attrs=read-write)"
                ), name
        finally:
            engine.dispose()
    finally:
        primary.engine.dispose()


def test_the_db_backends_write_refuses_a_hot_standby_and_says_so(pg_templates: Templates, replica: Replica) -> None:
    """The write's own transaction checks too: a pooled connection may reach another host than the
    re-read's did (a multi-host URL, an endpoint moved by a failover). Refused before any lock or
    write, with the setting to change, whole."""
    primary = Db(pg_templates.clone("3.1.2", "race_asset_fanout"))
    try:
        action = primary.actions(Mode.FAIL)[0]
        replica.wait_caught_up()
        engine = make_engine(parse_url(replica.url(primary.url)))
        try:
            backend = DbBackend(engine, open_airflow_db(engine).tables)
            work = Work(mode=Mode.FAIL, run_pk=action.run.id, to_fail=(), to_skip=(), fail_run=True)
            with pytest.raises(DatabaseError) as refused:
                backend.apply(action, work, lambda: Verdict(None, work.describe(), work))
            assert str(refused.value) == (
                f"database {redact(engine.url)} is a hot standby (in recovery, it may lag the primary): "
                "dupguard never writes there; set DUPGUARD_DATABASE_URL to the primary (a writer endpoint, "
                "not a reader endpoint; a multi-host URL needs target_session_attrs=read-write)"
            )
        finally:
            engine.dispose()
    finally:
        primary.engine.dispose()

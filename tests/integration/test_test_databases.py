"""The suite's own PostgreSQL hygiene: every database a test session makes is dropped at its end.

A shared server that kept them ran out of disk after a few dozen suites and stopped mid-run (CI failed
with 'Connection refused' from half the integration tests)."""

from __future__ import annotations

import uuid

import psycopg2
import pytest

from tests.pg import DISPOSABLE, Templates, admin_url, drop_databases, execute_admin

pytestmark = pytest.mark.integration


def _databases() -> set[str]:
    conn = psycopg2.connect(admin_url())
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT datname FROM pg_database")
            return {str(r[0]) for r in cur.fetchall()}
    finally:
        conn.close()


def test_drop_all_drops_the_clones_and_their_templates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DISPOSABLE, raising=False)  # CI's setting: this test is about the dropping itself
    before = _databases()
    templates = Templates(made={})
    templates.clone("3.1.2")
    templates.clone("3.1.2", "race_asset")
    templates.clone("3.2.2")
    made = _databases() - before
    assert len(made) == 5  # two templates and three clones

    templates.drop_all()

    assert not made & _databases()


def test_a_disposable_server_keeps_its_databases_to_the_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a server that goes with its machine (CI) nothing is dropped: the guard's session dropped its
    few dozen databases one by one in the last minute or two of a worker's run."""
    names = [f"keep_me_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    for name in names:
        execute_admin(f'CREATE DATABASE "{name}"')
    monkeypatch.setenv(DISPOSABLE, "1")
    drop_databases(names)
    kept = set(names) <= _databases()
    monkeypatch.delenv(DISPOSABLE)
    drop_databases(names)
    assert kept
    assert not set(names) & _databases()

"""``dupguard init-db`` on a schema an admin created beforehand, as docs/how-to/deploy-kubernetes.md ("Database role")
advises, for a role that has no CREATE on the database. ``CREATE SCHEMA IF NOT EXISTS`` checks the
database privilege before it looks for the schema, so it failed with "permission denied for database"
(exit 3) although there was nothing to create: init-db must only create what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy.engine import make_url

from tests.pg import Templates, execute_admin

pytestmark = pytest.mark.integration
DUPGUARD = str(Path(sys.executable).parent / "dupguard")

# How the admin hands the schema over: owned by the role, or owned by the admin with USAGE and CREATE.
HANDOVERS = {
    "owned": 'CREATE SCHEMA dupguard AUTHORIZATION "{role}"',
    "granted": 'CREATE SCHEMA dupguard; GRANT USAGE, CREATE ON SCHEMA dupguard TO "{role}"',
}


@pytest.fixture
def role() -> Iterator[str]:
    name = f"dg_ledger_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{name}" LOGIN')
    yield name
    execute_admin(f'DROP ROLE IF EXISTS "{name}"')


def _init_db(url: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")}
    env = clean | {"DUPGUARD_DATABASE_URL": url}
    return subprocess.run([DUPGUARD, "init-db"], env=env, capture_output=True, text=True, timeout=120, check=False)


def _ledger_tables(url: str) -> set[str]:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'dupguard'")
            return {row[0] for row in cur.fetchall()}
    finally:
        conn.close()


@pytest.mark.parametrize("handover", HANDOVERS)
def test_init_db_works_on_a_pre_created_schema_without_create_on_the_database(
    pg_templates: Templates, role: str, handover: str
) -> None:
    url = pg_templates.clone("3.1.2")
    dbname = make_url(url).database
    assert dbname is not None
    execute_admin(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC', dbname=dbname)
    execute_admin(HANDOVERS[handover].format(role=role), dbname=dbname)
    role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        for attempt in ("first", "again"):  # idempotent, like every init-db
            made = _init_db(role_url)
            assert made.returncode == 0, f"{attempt}: {made.stderr}"
            assert "permission denied" not in made.stderr
        assert _ledger_tables(role_url) == {"claims", "notes", "state"}
    finally:
        execute_admin("DROP SCHEMA IF EXISTS dupguard CASCADE", dbname=dbname)
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)


def test_init_db_without_a_schema_or_create_on_the_database_names_the_missing_grant(
    pg_templates: Templates, role: str
) -> None:
    """Nothing pre-created and no CREATE on the database: still refused (exit 3), as before."""
    url = pg_templates.clone("3.1.2")
    dbname = make_url(url).database
    assert dbname is not None
    execute_admin(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC', dbname=dbname)
    role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        made = _init_db(role_url)
        assert made.returncode == 3, made.stderr
        assert "permission denied for database" in made.stderr
    finally:
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)


def _doctor_ledger(url: str) -> dict:  # type: ignore[type-arg]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")}
    ran = subprocess.run(
        [DUPGUARD, "doctor", "--format", "json"],
        env=clean | {"DUPGUARD_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode in (0, 1), ran.stderr
    ledger: dict = json.loads(ran.stdout)["ledger"]  # type: ignore[type-arg]
    return ledger


@pytest.mark.parametrize("handover", [*HANDOVERS, None])
def test_doctor_says_whether_init_db_can_make_the_ledger(
    pg_templates: Templates, role: str, handover: str | None
) -> None:
    """Before the ledger's tables exist, doctor's ``can_create`` is what init-db will meet: USAGE and
    CREATE on a pre-created schema suffice without CREATE on the database; with neither, false."""
    url = pg_templates.clone("3.1.2")
    dbname = make_url(url).database
    assert dbname is not None
    execute_admin(f'REVOKE CREATE ON DATABASE "{dbname}" FROM PUBLIC', dbname=dbname)
    execute_admin(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"', dbname=dbname)
    if handover:
        execute_admin(HANDOVERS[handover].format(role=role), dbname=dbname)
    role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        assert _doctor_ledger(role_url) == {"setting": "auto", "exists": False, "can_create": handover is not None}
        if handover:  # and it is true: init-db makes it
            assert _init_db(role_url).returncode == 0
            assert _doctor_ledger(role_url)["exists"] is True
    finally:
        execute_admin("DROP SCHEMA IF EXISTS dupguard CASCADE", dbname=dbname)
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)

"""The deploy guide's read-only GRANT statements, one per Airflow version, run on each committed schema for a
real login role; then ``dupguard scan`` and ``dupguard run --once`` as that role must work (they failed
on 3.0/3.1 with one statement naming ``asset_partition_dag_run``, a 3.2 table). docs/how-to/deploy-kubernetes.md must
give the same statements. Also: ``init-db`` reads ``DUPGUARD_DATABASE_URL_FILE``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest
from sqlalchemy.engine import make_url

from tests.pg import ROOT, Templates, execute_admin, ground_truth

pytestmark = pytest.mark.integration
DUPGUARD = str(Path(sys.executable).parent / "dupguard")
# version -> (the deploy guide's comment naming the versions, an Airflow-made duplicate scenario or None)
VERSIONS = {
    "3.0.6": ("3.0 and 3.1", "race_asset"),
    "3.1.2": ("3.0 and 3.1", "race_asset"),
    "3.2.2": ("3.2 and 3.3", "race_partitioned"),
    "3.3.2": ("3.2 and 3.3", None),
}


def documented_grants(path: Path) -> dict[str, str]:
    """``{"3.0 and 3.1": "GRANT …;", …}`` from the ``-- … Airflow X and Y:`` comment lines of ``path``."""
    found = re.findall(r"--[^\n]*Airflow (\d\.\d and \d\.\d):\s*\n\s*(GRANT SELECT ON [^;]+;)", path.read_text())
    return {versions: " ".join(statement.split()) for versions, statement in found}


def _dupguard(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DUPGUARD_")}
    return subprocess.run([DUPGUARD, *args], env=clean | env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def role() -> Iterator[str]:
    name = f"dg_ro_{uuid.uuid4().hex[:8]}"
    execute_admin(f'CREATE ROLE "{name}" LOGIN')
    yield name
    execute_admin(f'DROP ROLE IF EXISTS "{name}"')


def test_deploy_guide_gives_one_statement_per_version_family() -> None:
    """The deploy guide is the one place the read-only GRANTs are written; the README links it."""
    assert set(documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")) == {"3.0 and 3.1", "3.2 and 3.3"}
    assert "GRANT SELECT ON" not in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_read_only_role_with_the_documented_grant_scans_and_runs(
    version: str, pg_templates: Templates, role: str, tmp_path: Path
) -> None:
    versions, scenario = VERSIONS[version]
    url = pg_templates.clone(version, scenario)
    dbname = make_url(url).database
    assert dbname is not None
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")[versions]
    execute_admin(grant.replace("TO dupguard;", f'TO "{role}";'), dbname=dbname)
    try:
        role_url = make_url(url).set(username=role, password=None).render_as_string(hide_password=False)
        groups = len(ground_truth(version, scenario)["expected_groups"]) if scenario else 0

        scan = _dupguard("scan", "--database-url", role_url, "--format", "json")
        assert scan.returncode == (1 if groups else 0), scan.stderr
        assert len(json.loads(scan.stdout)["groups"]) == groups

        once = _dupguard(
            "run", "--once", "--database-url", role_url,
            DUPGUARD_STARTUP_LOOKBACK="3650d", DUPGUARD_LOG_FORMAT="json", DUPGUARD_HTTP_PORT="0",
        )  # fmt: skip
        assert once.returncode == 0, once.stderr
        lines = [json.loads(line) for line in once.stderr.splitlines() if line.startswith("{")]
        assert sum(e["event"] == "duplicate_detected" for e in lines) == groups
        expected = {"ledger_in_memory", "duplicate_detected"}  # a read-only role has no durable ledger
        warned = [e for e in lines if e["level"] in ("warning", "error") and e["event"] not in expected]
        # a duplicate of these fixtures whose task already ran is reported too_late, a warning (every
        # outcome gives one remediation line): what on-call must hear, not a grant problem
        assert [e for e in warned if not (e["event"] == "remediation" and e["result"] == "too_late")] == []
        assert "permission denied" not in once.stderr

        conn = psycopg2.connect(role_url)  # and it is read-only
        try:
            with pytest.raises(psycopg2.errors.InsufficientPrivilege), conn.cursor() as cur:
                cur.execute("UPDATE dag_run SET state = state")
        finally:
            conn.close()
    finally:
        execute_admin(f'DROP OWNED BY "{role}"', dbname=dbname)


def test_the_3_2_statement_fails_on_3_0_and_3_1(pg_templates: Templates, role: str) -> None:
    """Why there are two: a GRANT naming a table that does not exist fails as a whole."""
    url = pg_templates.clone("3.1.2")
    dbname = make_url(url).database
    assert dbname is not None
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")["3.2 and 3.3"].replace(
        "TO dupguard;", f'TO "{role}";'
    )
    with pytest.raises(psycopg2.errors.UndefinedTable):
        execute_admin(grant, dbname=dbname)


def test_init_db_reads_the_url_from_a_file(pg_templates: Templates, tmp_path: Path) -> None:
    """``init-db`` (and ``--drop``) with only DUPGUARD_DATABASE_URL_FILE set, like ``run``."""
    url = pg_templates.clone("3.1.2")
    secret = tmp_path / "url"
    secret.write_text(url + "\n")
    made = _dupguard("init-db", DUPGUARD_DATABASE_URL_FILE=str(secret))
    assert made.returncode == 0, made.stderr
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'dupguard'")
            assert cur.fetchone() == (3,)
    finally:
        conn.close()
    dropped = _dupguard("init-db", "--drop", DUPGUARD_DATABASE_URL_FILE=str(secret))
    assert dropped.returncode == 0, dropped.stderr

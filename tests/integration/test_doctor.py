"""``dupguard doctor`` on every committed Airflow schema (2.10.5-3.3.2, real PostgreSQL) and against a
real Airflow 3.1.2 API server (remediation readiness, ``--source api``). Read-only is proven, not
assumed: the database checks run as a role whose every transaction is read-only
(``default_transaction_read_only``), and the API probe leaves Airflow's runs, notes and audit log as
they were."""

from __future__ import annotations

import io
import json
import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from sqlalchemy.engine import make_url

from detector.app.cli import main
from detector.core.model import GUARD_NOTE_PREFIX
from tests.airflow_server import AirflowServer, airflow_api_server, db_state, sql, start_queued_runs
from tests.integration.test_grants import documented_grants
from tests.pg import ROOT, Templates, database_url, execute_admin, ground_truth
from tests.pg_replica import Replica
from tests.pgbouncer import pgbouncer

pytestmark = pytest.mark.integration
ALL_HISTORY = "3650d"  # the fixtures' runs are from 2026-11: a fixed look-back would age them out
# version -> (scenario, the code path its duplicates or splits take)
SCHEMAS = {
    "2.10.5": (None, None),
    "3.0.6": ("race_asset", "asset_triggered"),
    "3.1.2": ("race_asset", "asset_triggered"),
    "3.2.2": ("race_partitioned", "partitioned"),
    "3.3.2": ("split_and", "split_partition"),
}


@pytest.fixture(autouse=True)
def _no_dupguard_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("DUPGUARD_") and n != "DUPGUARD_TEST_DATABASE_URL"]:
        monkeypatch.delenv(name)


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["doctor", "--format", "json", "--since", ALL_HISTORY, *args])
    return code, json.loads(out.getvalue())


def _schedulers(url: str, alive: int) -> None:
    """``alive`` scheduler jobs heartbeating now, plus one whose heartbeat is past Airflow's 30 s
    threshold and one that ended: neither counts."""
    insert = "INSERT INTO job (id, job_type, state, latest_heartbeat) VALUES (:id, :type, :state, now() - :age)"
    for i in range(alive):
        sql(url, insert, id=9000 + i, type="SchedulerJob", state="running", age=timedelta(seconds=1))
    sql(url, insert, id=9100, type="SchedulerJob", state="running", age=timedelta(seconds=31))
    sql(url, insert, id=9101, type="SchedulerJob", state="success", age=timedelta(0))
    sql(url, insert, id=9102, type="TriggererJob", state="running", age=timedelta(0))


@dataclass
class Role:
    name: str
    databases: list[str] = field(default_factory=list)  # where it was granted something


@pytest.fixture
def read_only_role() -> Iterator[Role]:
    role = Role(f"dg_doc_{uuid.uuid4().hex[:8]}")
    execute_admin(f'CREATE ROLE "{role.name}" LOGIN')
    execute_admin(f'ALTER ROLE "{role.name}" SET default_transaction_read_only = on')
    yield role
    for dbname in role.databases:  # its grants first, or the role cannot be dropped
        execute_admin(f'DROP OWNED BY "{role.name}"', dbname=dbname)
    execute_admin(f'DROP ROLE IF EXISTS "{role.name}"')


def _as(url: str, role: Role, grant: str) -> str:
    """``url`` logged in as ``role`` after ``grant`` (with ``{role}``) ran in that database."""
    dbname = make_url(url).database
    assert dbname is not None
    execute_admin(grant.format(role=f'"{role.name}"'), dbname=dbname)
    role.databases.append(dbname)
    return make_url(url).set(username=role.name, password=None).render_as_string(hide_password=False)


ALL_GRANTS = "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO {role}"


def _scan_summary(url: str) -> dict[str, Any]:
    out = io.StringIO()
    with redirect_stdout(out):
        main(["scan", "--database-url", url, "--format", "json", "--since", ALL_HISTORY])
    summary: dict[str, Any] = json.loads(out.getvalue())["summary"]
    return summary


@pytest.mark.parametrize("version", SCHEMAS)
def test_every_schema_read_only_with_the_verdict_of_its_release(
    version: str, pg_templates: Templates, read_only_role: Role
) -> None:
    """Each query runs on each schema; the role's transactions are read-only, so any write would fail."""
    scenario, path = SCHEMAS[version]
    url = pg_templates.clone(version, scenario)
    _schedulers(url, alive=2)
    code, doc = doctor("--database-url", _as(url, read_only_role, ALL_GRANTS))

    assert doc["problems"] == []
    assert doc["schedulers_alive"] == 2
    assert all(g["held"] for g in doc["grants"] if g["privilege"] != "DELETE")
    assert doc["database"] == {"server": {"role": "primary", "replay_lag_seconds": None}, "session_pinned": True}
    assert doc["ledger"] == {"setting": "auto", "exists": False, "can_create": False}
    statuses = {p["name"]: p["status"] for p in doc["code_paths"]}
    if path is None:  # Airflow 2
        assert code == 0 and doc["exit_code"] == 0
        assert set(statuses.values()) == {"not_affected"}
        assert doc["duplicates"] is None
        assert doc["dags"] == {"asset_scheduled": 0, "partitioned": 0, "partitioned_multi_asset": 0, "watcher_fed": 0}
        return
    assert scenario is not None
    assert code == 1 and doc["at_risk_unprotected"] == [path]
    assert statuses[path] == "at_risk"
    assert [n for n, s in statuses.items() if s == "at_risk"] == [path]
    summary = _scan_summary(url)
    assert {k: doc["duplicates"][k] for k in summary} == summary  # the scan's own summary
    assert doc["duplicates"]["groups"] == len(ground_truth(version, scenario)["expected_groups"])
    assert doc["dags"]["asset_scheduled"] == 1
    assert doc["dags"]["watcher_fed"] == 0
    if version >= "3.2":
        assert doc["dags"]["partitioned"] == 1
        assert doc["dags"]["partitioned_multi_asset"] == (1 if path == "split_partition" else 0)
    if path == "split_partition":
        assert doc["duplicates"]["split_partitions"] >= 1


def test_one_scheduler_and_no_duplicate_is_not_at_risk_two_are(pg_templates: Templates) -> None:
    url = pg_templates.clone("3.1.2", "successive")
    _schedulers(url, alive=1)
    code, doc = doctor("--database-url", url)
    assert (code, doc["schedulers_alive"], doc["duplicates"]["groups"]) == (0, 1, 0)
    assert {p["name"]: p["status"] for p in doc["code_paths"]}["asset_triggered"] == "not_exposed"
    family = {r["name"]: r["status"] for r in doc["family"]}  # named; exit 0 all the same
    assert family == {"trigger_flapping": "not_exposed", "stranded_events": "at_risk", "double_bump": "not_exposed"}
    assert doc["triggerers_alive"] is not None and doc["triggerers_alive"] < 2  # the fixture has no second one
    sql(url, "INSERT INTO job (id, job_type, state, latest_heartbeat) VALUES (9200, 'SchedulerJob', 'running', now())")
    code, doc = doctor("--database-url", url)
    assert (code, doc["schedulers_alive"], doc["at_risk_unprotected"]) == (1, 2, ["asset_triggered"])


def test_the_guards_notes_mean_protected(pg_templates: Templates) -> None:
    url = pg_templates.clone("3.1.2", "race_asset")
    code, doc = doctor("--database-url", url)
    assert code == 1 and doc["guard"]["active"] is None and "pip show" in doc["guard"]["how_to_check"]
    note = "INSERT INTO dag_run_note (dag_run_id, content, created_at, updated_at) "
    note += "SELECT max(id), :content, now(), now() FROM dag_run"
    sql(url, note, content=f"{GUARD_NOTE_PREFIX}x (HA scheduler race)")
    code, doc = doctor("--database-url", url)
    assert (code, doc["guard"]["notes"], doc["guard"]["active"]) == (0, 1, True)
    assert {p["name"]: p["protected"] for p in doc["code_paths"]}["asset_triggered"] is True


def test_a_periodic_checks_table_left_out_of_the_grant_is_named(pg_templates: Templates, read_only_role: Role) -> None:
    """The checks' tables are grants the doctor checks too (need ``checks``), not only the detection's."""
    url = pg_templates.clone("3.1.2", "race_asset")
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")["3.0 and 3.1"].replace(
        "TO dupguard;", "TO {role}"
    )
    grant += "; REVOKE SELECT ON trigger, task_instance_history FROM {role}"
    _, doc = doctor("--database-url", _as(url, read_only_role, grant))
    lacking = {(g["need"], g["table"], g["privilege"]) for g in doc["grants"] if not g["held"]}
    assert {("checks", "trigger", "SELECT"), ("checks", "task_instance_history", "SELECT")} <= lacking
    assert not any(need == "checks" and table not in {"trigger", "task_instance_history"} for need, table, _ in lacking)
    problem = (
        "checks lacks SELECT on task_instance_history, SELECT on trigger "
        "(docs/how-to/deploy-kubernetes.md, section 2: Database role)"
    )
    assert problem in doc["problems"]


def test_the_readme_grant_alone_detects_and_says_what_it_cannot_count(
    pg_templates: Templates, read_only_role: Role
) -> None:
    url = pg_templates.clone("3.2.2", "race_partitioned")
    grant = documented_grants(ROOT / "docs" / "how-to" / "deploy-kubernetes.md")["3.2 and 3.3"].replace(
        "TO dupguard;", "TO {role}"
    )
    code, doc = doctor("--database-url", _as(url, read_only_role, grant), "--remediation-backend", "db")
    assert code == 1
    # the grant covers the periodic checks' tables, so the doctor counts DAGs too
    assert doc["dags"] == {"asset_scheduled": 1, "partitioned": 1, "partitioned_multi_asset": 0, "watcher_fed": 0}
    assert doc["problems"] == []
    assert doc["duplicates"]["groups"] == 1
    lacking = {(g["table"], g["privilege"]) for g in doc["grants"] if not g["held"]}
    assert lacking == {
        ("dag_run", "UPDATE"),
        ("task_instance", "UPDATE"),
        ("dag_run_note", "INSERT"),
        ("dag_run_note", "UPDATE"),
        ("asset_dag_run_queue", "INSERT"),  # DUPGUARD_REPAIR_STRANDED=requeue's write, not in the read-only grant
    }
    assert any("the db backend lacks" in p for p in doc["remediation"]["problems"])
    assert doc["repair_stranded"] == {"mode": "dry-run", "problems": [], "can_act": False}
    _, doc = doctor("--database-url", _as(url, read_only_role, grant), "--repair-stranded", "requeue")
    # the default backend, auto, on this role: api, and doctor says why and what it costs
    auto = doc["remediation"]["auto"]
    assert doc["remediation"]["backend"] == "auto" and auto["picks"] == "api"
    assert auto["why_not_db"] == (
        "the database role lacks UPDATE on dag_run, UPDATE on task_instance, INSERT on dag_run_note, "
        "UPDATE on dag_run_note"
    )
    assert "apache/airflow#71360" in auto["consequence"] and "GRANT" in auto["consequence"]
    assert doc["repair_stranded"] == {
        "mode": "requeue",
        "problems": ["DUPGUARD_REPAIR_STRANDED=requeue lacks asset_dag_run_queue INSERT: nothing is re-queued"],
        "can_act": False,
    }


def test_the_table_names_the_verdict(pg_templates: Templates, capsys: pytest.CaptureFixture[str]) -> None:
    url = pg_templates.clone("3.2.2", "race_partitioned")
    assert main(["doctor", "--database-url", url, "--since", ALL_HISTORY]) == 1
    text = capsys.readouterr().out
    assert "partitioned (apache/airflow#68045)" in text
    assert "AT RISK, unprotected: partitioned" in text.splitlines()[-1]


def test_bad_settings_exit_2_and_an_unreachable_database_3(tmp_path: Path) -> None:
    code, doc = doctor("--database-url", "mysql://x@y/z")
    assert code == 2 and doc["exit_code"] == 2 and "not supported" in doc["error"]
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    code, doc = doctor("--database-url", missing)
    assert code == 3 and doc["exit_code"] == 3


# --- a real Airflow API server ----------------------------------------------------------------------

VERSION, FANOUT = "3.1.2", "race_asset_fanout"  # three Airflow-made duplicate pairs


@pytest.fixture(scope="module")
def af(pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowServer]:
    with airflow_api_server(VERSION, [FANOUT], pg_templates, tmp_path_factory.mktemp("af-doctor")) as server:
        worker = threading.Thread(target=start_queued_runs, args=(VERSION, database_url(server.sources[FANOUT])))
        worker.start()
        worker.join()
        server.reset(FANOUT)
        yield server


def _audit_rows(url: str) -> int:
    conn = psycopg2.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT count(*) FROM log")
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def _api(af: AirflowServer, user: str, password: str, *args: str) -> tuple[int, dict[str, Any]]:
    creds = ["--airflow-api-url", af.url, "--airflow-username", user, "--airflow-password", password]
    return doctor(*creds, *args)


@pytest.mark.airflow
def test_an_acting_remediation_protects_and_the_probe_writes_nothing(af: AirflowServer) -> None:
    before, audit = db_state(af.db_url), _audit_rows(af.db_url)
    code, doc = _api(
        af, "admin", "admin", "--database-url", af.db_url, "--remediation", "fail", "--remediation-backend", "api"
    )
    assert doc["remediation"]["api"] | {"url": None} == {
        "url": None, "reachable": True, "credentials": True, "permission": True, "error": None,
    }  # fmt: skip
    assert doc["remediation"]["can_act"] is True and doc["remediation"]["problems"] == []
    assert doc["duplicates"]["groups"] == 3
    assert code == 0 and doc["at_risk_unprotected"] == []
    assert db_state(af.db_url) == before and _audit_rows(af.db_url) == audit


@pytest.mark.airflow
def test_a_viewer_lacks_the_permission_and_a_wrong_password_the_credentials(af: AirflowServer) -> None:
    code, doc = _api(
        af, "viewer", "viewer", "--database-url", af.db_url, "--remediation", "fail", "--remediation-backend", "api"
    )
    api = doc["remediation"]["api"]
    assert (api["reachable"], api["credentials"], api["permission"]) == (True, True, False)
    assert "HTTP 403" in api["error"] and code == 1
    code, doc = _api(
        af,
        "admin",
        "wrong-secret-pw",
        "--database-url",
        af.db_url,
        "--remediation",
        "fail",
        "--remediation-backend",
        "api",
    )
    api = doc["remediation"]["api"]
    assert (api["credentials"], api["permission"]) == (False, None)
    assert "wrong-secret-pw" not in json.dumps(doc)
    assert code == 1


@pytest.mark.airflow
def test_the_rest_source(af: AirflowServer) -> None:
    before = db_state(af.db_url)
    code, doc = _api(af, "admin", "admin", "--source", "api")
    assert doc["source"] == "api" and doc["airflow"]["version"] == VERSION
    assert doc["duplicates"]["groups"] == 3 and doc["duplicates"]["split_partitions"] is None
    assert doc["schedulers_alive"] is None and doc["database"] is None and doc["grants"] is None
    assert code == 1 and doc["at_risk_unprotected"] == ["asset_triggered"]
    assert doc["remediation"]["api"]["permission"] is True  # ready, but dry-run does not stop anything
    assert db_state(af.db_url) == before


def test_the_rest_source_unreachable_exits_3() -> None:
    code, doc = doctor(
        "--source", "api", "--airflow-api-url", "http://127.0.0.1:9", "--airflow-token", "t", "--airflow-timeout", "1s"
    )
    assert code == 3 and doc["exit_code"] == 3


# --- what the URLs go through: PgBouncer, a hot standby -------------------------------------------------


@pytest.mark.parametrize(("pool_mode", "pinned"), [("transaction", False), ("session", True)])
def test_a_pooler_in_transaction_mode_is_named(pg_templates: Templates, pool_mode: str, pinned: bool) -> None:
    url = pg_templates.clone("3.1.2", "race_asset")
    with pgbouncer(url, pool_mode) as bounced:
        code, doc = doctor("--database-url", bounced, "--lock-database-url", url)
    assert doc["database"]["session_pinned"] is pinned
    assert doc["lock_database"] == {
        "server": {"role": "primary", "replay_lag_seconds": None}, "session_pinned": True, "error": None,
    }  # fmt: skip
    assert code == 1 and doc["duplicates"]["groups"] == 1  # detection reads through it all the same


def test_a_standby_is_named_and_the_db_backend_refused_there(pg_templates: Templates, replica: Replica) -> None:
    url = pg_templates.clone("3.1.2", "race_asset")
    replica.wait_caught_up()
    code, doc = doctor("--database-url", replica.url(url), "--remediation", "fail", "--remediation-backend", "db")
    assert doc["database"]["server"]["role"] == "standby"
    assert any("standby" in p for p in doc["remediation"]["problems"])
    assert doc["remediation"]["can_act"] is False
    assert code == 1 and doc["duplicates"]["groups"] == 1

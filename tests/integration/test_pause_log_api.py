"""What a real Airflow API server writes to its ``log`` table when a DAG is paused and unpaused through
``PATCH /api/v2/dags/{dag_id}`` (what the UI's toggle calls: ``requestBody: {is_paused: !isPaused}`` in every
version's UI bundle), and what the stranded_events check reads of it (``rule_pauses``): the direction on 3.1+,
none on 3.0.x (it writes ``"is_paused": false`` both ways). The CLI's rows are in the stranded_paused_run
fixtures (scripts/airflow/scenarios_stranded.py)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import psycopg2
import pytest

from detector.checks.stranded_events import statements
from detector.metadb.engine import make_engine, open_airflow_db, parse_url
from detector.metadb.schema import Family
from tests.airflow_server import AirflowServer, airflow_api_server, wait_for_fixture
from tests.pg import Templates

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

SCENARIO = "stranded_paused_run"  # has orders_consumer
VERSIONS = [v for v in ("3.0.6", "3.1.2", "3.2.2", "3.3.2") if wait_for_fixture(v, SCENARIO)]
DAG = "orders_consumer"


def _call(server: AirflowServer, method: str, path: str, body: object, token: str | None = None) -> object:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(server.url + path, json.dumps(body).encode(), headers, method=method)  # noqa: S310 - http://127.0.0.1
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - the test server
        return json.load(response)


@pytest.fixture(params=VERSIONS)
def server(
    request: pytest.FixtureRequest, pg_templates: Templates, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[AirflowServer]:
    with airflow_api_server(request.param, [SCENARIO], pg_templates, tmp_path_factory.mktemp("af-pause")) as s:
        yield s


def test_rest_and_ui_pause_and_unpause_rows(server: AirflowServer) -> None:
    token = _call(server, "POST", "/auth/token", {"username": "admin", "password": "admin"})
    assert isinstance(token, dict)
    for paused in (True, False):
        done = _call(server, "PATCH", f"/api/v2/dags/{DAG}?update_mask=is_paused", {"is_paused": paused},
                     token["access_token"])  # fmt: skip
        assert isinstance(done, dict) and done["is_paused"] is paused
    with psycopg2.connect(server.db_url) as conn, conn.cursor() as cur:
        cur.execute("SELECT event, dag_id, extra FROM log WHERE event LIKE 'patch_dag%%' ORDER BY id")
        rows = cur.fetchall()
    assert [(e, d) for e, d, _ in rows] == [("patch_dag", DAG), ("patch_dag", DAG)]
    written = [json.loads(x)["is_paused"] for _, _, x in rows]
    engine = make_engine(parse_url(server.db_url))
    try:
        db = open_airflow_db(engine)
        three_oh = db.info.family == Family.AIRFLOW_3_0
        with engine.connect() as conn:
            log = statements.pause_log(conn, db.tables, {DAG}, patch_direction=not three_oh)
    finally:
        engine.dispose()
    read = [r.paused for r in log.records if r.dag_id == DAG and r.at >= log.records[-2].at]
    if three_oh:
        assert written == [False, False] and read == [None, None]  # 3.0.x: `params["is_paused"] == "false"`
    else:
        assert written == [True, False] and read == [True, False]

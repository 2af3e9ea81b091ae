"""dupguard's Airflow UI plugin, "HA health": findings on a DAG run's page and on a nav page (Airflow 3.1+).

Loaded by Airflow's API server through the ``airflow.plugins`` entry point of the package that also holds
the in-scheduler guard (deploy/airflow-guard/), so installing that package is the whole install; off
with ``DUPGUARD_UI=off`` (docs/how-to/ui-plugin.md). Read-only: no route writes.

Why the findings come from a ``dupguard`` command and not from dupguard's modules imported here: Airflow
3.0/3.1 run SQLAlchemy 1.4 and dupguard needs 2.0, and the guard's package must not pull dupguard's
dependencies into Airflow's image. So the plugin runs ``dupguard scan --format json`` and ``dupguard
doctor --format json`` (``DUPGUARD_UI_COMMAND``, e.g. a separate virtualenv) against Airflow's own
database URL: the same rules as ``scan``, never a second copy. Pages answer from the last answer in
memory, refreshed in the background after ``DUPGUARD_UI_REFRESH`` seconds (before the first one is in,
a page says so and reloads itself); the notes on a run (what dupguard did to it) are read through the
API server's own session.

Security: Airflow does not protect a plugin's FastAPI app, so every route depends on Airflow's own
``get_user`` (the UI's ``_token`` cookie, which reaches the iframe as it is the same origin, or a
bearer token) and shows only the DAGs the auth manager lets that user read.
"""

from __future__ import annotations

import os
import shlex
from typing import Annotated, Any
from urllib.parse import urlsplit

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails
from airflow.api_fastapi.core_api.security import get_user
from airflow.configuration import conf
from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from sqlalchemy import bindparam, text

from . import ha_health
from .ha_health_scans import Scans

PREFIX = "/dupguard"
NAV_ROUTE = "ha-health"
RUN_ROUTE = "ha-health-run"


def enabled() -> bool:
    return os.environ.get("DUPGUARD_UI", "on").strip().lower() not in {"off", "false", "0", "no"}


SCANS = Scans(
    shlex.split(os.environ.get("DUPGUARD_UI_COMMAND", "dupguard")),
    since=os.environ.get("DUPGUARD_UI_SINCE", "7d"),
    refresh=float(os.environ.get("DUPGUARD_UI_REFRESH", "60")),
    timeout=float(os.environ.get("DUPGUARD_UI_TIMEOUT", "120")),
    database_url=lambda: conf.get("database", "sql_alchemy_conn"),
)


def _allowed(user: Any) -> set[str]:
    return set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))


def _links() -> ha_health.Links:
    return ha_health.Links(urlsplit(conf.get("api", "base_url", fallback="") or "").path, PREFIX, RUN_ROUTE)


def _notes(dag_id: str, run_ids: list[str]) -> dict[str, str]:
    """The note on each of these runs (dupguard's and its guard's name what they did), read through the
    API server's own session."""
    if not run_ids:
        return {}
    from airflow.utils.session import create_session

    statement = text(
        "SELECT r.run_id, n.content FROM dag_run r JOIN dag_run_note n ON n.dag_run_id = r.id "
        "WHERE r.dag_id = :dag_id AND r.run_id IN :run_ids"
    ).bindparams(bindparam("run_ids", expanding=True))
    with create_session() as session:
        rows = session.execute(statement, {"dag_id": dag_id, "run_ids": run_ids})
        return {run_id: content for run_id, content in rows if content}


User = Annotated[Any, Depends(get_user)]  # Airflow's own check: the UI's _token cookie or a bearer token

app = FastAPI(title="dupguard HA health", docs_url=None, redoc_url=None, openapi_url=None)


PAGE_WAIT = 0.8  # seconds a page waits for the first scan before it says "scanning" (and reloads itself)


@app.get("/api/findings")
def findings(user: User) -> dict[str, Any]:
    """The scan document with only the DAGs this user may read (for tools, and the tests): waits for it."""
    docs = SCANS.documents(2 * SCANS.timeout + 5)  # doctor, then scan
    if docs is None:
        raise HTTPException(status_code=503, detail="dupguard has not finished its first scan")
    return ha_health.readable(docs[0], _allowed(user))


@app.get("/health", response_class=HTMLResponse)
def nav_page(user: User, dag: str = "", kind: str = "") -> str:
    docs = SCANS.documents(PAGE_WAIT)
    if docs is None:
        return ha_health.render_pending("HA health")
    doc, doctor = docs
    return ha_health.render_nav(
        ha_health.readable(doc, _allowed(user)), doctor, _links(), dag=dag, kind=kind
    )


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse)
def run_page(dag_id: str, run_id: str, user: User) -> str:
    details = DagDetails(id=dag_id)
    if not get_auth_manager().is_authorized_dag(
        method="GET", access_entity=DagAccessEntity.RUN, details=details, user=user
    ):
        raise HTTPException(status_code=403, detail="Forbidden")
    docs = SCANS.documents(PAGE_WAIT)
    if docs is None:
        return ha_health.render_pending(f"HA health of run {run_id}")
    doc = ha_health.readable(docs[0], {dag_id})
    notes = _notes(dag_id, ha_health.run_ids_of(ha_health.groups_of_run(doc, dag_id, run_id)))
    return ha_health.render_run(doc, dag_id, run_id, notes, _links())


class DupguardUiPlugin(AirflowPlugin):
    name = "dupguard"
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "dupguard HA health"}] if enabled() else []
    # Airflow 3.0 has no external views: the pages are then at <base>/dupguard/health only.
    external_views = (
        [
            {
                "name": "HA health",
                "href": f"{PREFIX}/health",
                "destination": "nav",
                "category": "browse",
                "url_route": NAV_ROUTE,
            },
            {
                "name": "HA health",
                "href": PREFIX + "/runs/{DAG_ID}/{RUN_ID}",
                "destination": "dag_run",
                "url_route": RUN_ROUTE,
            },
        ]
        if enabled()
        else []
    )

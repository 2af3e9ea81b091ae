"""Problems no single setting shows: settings that need each other, or exclude each other.

Each message names the env var; ``load`` rewrites it to the flag when a flag set the value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def cross_checks(v: Mapping[str, Any]) -> list[str]:
    problems: list[str] = []
    api_source = v.get("source") == "api"
    if not v.get("database_url") and not api_source:
        problems.append("DUPGUARD_DATABASE_URL (or --database-url, or _FILE) is required")
    if api_source:
        problems.extend(_api_source_checks(v))
    elif v.get("state_file"):
        problems.append(
            "DUPGUARD_STATE_FILE is for DUPGUARD_SOURCE=api (the database source keeps its ledger in the DB)"
        )
    if v.get("remediation") in {"fail", "skip"} and surely_api(v):
        if not v.get("airflow_api_url"):
            problems.append("DUPGUARD_REMEDIATION=fail/skip with the api backend needs DUPGUARD_AIRFLOW_API_URL")
        problems.extend(api_auth_problems(v, "the api backend"))
    url = v.get("database_url") or ""
    if v.get("remediation_backend") == "db" and v.get("remediation") in {"fail", "skip"} and url.startswith("sqlite"):
        problems.append("DUPGUARD_REMEDIATION_BACKEND=db cannot write to SQLite: dupguard opens SQLite read-only")
    if v.get("slack_bot_token") and not v.get("slack_channel"):
        problems.append("DUPGUARD_SLACK_BOT_TOKEN needs DUPGUARD_SLACK_CHANNEL")
    problems.extend(_alertmanager_checks(v))
    return problems


def surely_api(v: Mapping[str, Any]) -> bool:
    """The api backend whatever the database grants: set so, or auto where db cannot write (the REST API
    source, SQLite). auto on PostgreSQL is decided at start (detector/actions/remediation/choice.py)."""
    backend = v.get("remediation_backend")
    no_db = v.get("source") == "api" or (v.get("database_url") or "").startswith("sqlite")
    return backend == "api" or (backend == "auto" and no_db)


def _alertmanager_checks(v: Mapping[str, Any]) -> list[str]:
    """At most one way to authenticate to Alertmanager, and a whole one."""
    if v.get("alertmanager_bearer_token") and (v.get("alertmanager_username") or v.get("alertmanager_password")):
        return ["set DUPGUARD_ALERTMANAGER_BEARER_TOKEN or DUPGUARD_ALERTMANAGER_USERNAME/_PASSWORD, not both"]
    if bool(v.get("alertmanager_username")) != bool(v.get("alertmanager_password")):
        return ["DUPGUARD_ALERTMANAGER_USERNAME and DUPGUARD_ALERTMANAGER_PASSWORD go together (basic auth)"]
    return []


def api_auth_problems(v: Mapping[str, Any], who: str) -> list[str]:
    """Exactly one way to authenticate to Airflow's REST API (for ``who``: the api backend or source)."""
    ways = [
        bool(v.get("airflow_token")),
        bool(v.get("airflow_token_command")),
        bool(v.get("airflow_username") and v.get("airflow_password")),
    ]
    if not any(ways):
        return [
            f"{who} needs DUPGUARD_AIRFLOW_TOKEN, DUPGUARD_AIRFLOW_TOKEN_COMMAND, "
            "or DUPGUARD_AIRFLOW_USERNAME and DUPGUARD_AIRFLOW_PASSWORD"
        ]
    if v.get("airflow_token_command") and (v.get("airflow_token") or v.get("airflow_password")):
        other = "DUPGUARD_AIRFLOW_TOKEN" if v.get("airflow_token") else "DUPGUARD_AIRFLOW_PASSWORD"
        return [f"set DUPGUARD_AIRFLOW_TOKEN_COMMAND or {other}, not both (which one would dupguard use?)"]
    return []


def _api_source_checks(v: Mapping[str, Any]) -> list[str]:
    """``--source api`` reads only the REST API: it needs the API and credentials, and no DB write."""
    problems: list[str] = []
    reported = v.get("remediation") in {"fail", "skip"} and surely_api(v)  # just below
    if not v.get("airflow_api_url") and not reported:
        problems.append("DUPGUARD_SOURCE=api needs DUPGUARD_AIRFLOW_API_URL")
    if not reported:
        problems.extend(api_auth_problems(v, "DUPGUARD_SOURCE=api"))
    if v.get("remediation_backend") == "db":
        problems.append(
            "DUPGUARD_REMEDIATION_BACKEND=db writes to the metadata database, which DUPGUARD_SOURCE=api does not "
            "use: use DUPGUARD_REMEDIATION_BACKEND=api"
        )
    return problems

"""Which backend ``DUPGUARD_REMEDIATION_BACKEND=auto`` stops runs with, and why.

The db backend sets a stopped run's start_date (= end_date); the api backend cannot (no public
endpoint writes it), and Airflow 3.0.6-3.3.2 then answer HTTP 500 for every asset event that run
consumed, the kept run's included (apache/airflow#71360). So ``auto`` takes db wherever it can
write: the database source on PostgreSQL with the grants below. Chosen once, at start: a grant
given or revoked later takes effect at the next start (a revoked one makes db writes fail loudly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import Connection

from detector.metadb import catalog

# What the db backend writes (docs/explanation/remediation.md); doctor checks the same grants.
DB_BACKEND: tuple[tuple[str, str], ...] = (
    ("dag_run", "UPDATE"),
    ("task_instance", "UPDATE"),
    ("dag_run_note", "INSERT"),
    ("dag_run_note", "UPDATE"),
)
GUARD = "install the in-scheduler guard (docs/how-to/guard.md)"
WAY_OUT = (
    "grant them (GRANT UPDATE ON dag_run, task_instance TO <role>; GRANT INSERT, UPDATE ON dag_run_note "
    f"TO <role>) or {GUARD}"
)
HARM = (
    "runs failed through the api backend keep an empty start_date, and Airflow 3.0.6-3.3.2 answer HTTP 500 "
    "for their asset events (apache/airflow#71360)"
)


@dataclass(frozen=True, slots=True)
class Choice:
    backend: str  # api or db
    why_not_db: str | None  # None: db, or a backend set explicitly


def lacking(held: Mapping[str, bool]) -> list[str]:
    """The db backend's grants missing from ``held`` (``{"table:PRIVILEGE": held}``), as "PRIVILEGE on table"."""
    return [f"{p} on {t}" for t, p in DB_BACKEND if not held.get(f"{t}:{p}", False)]


def held_grants(conn: Connection) -> dict[str, bool]:
    return dict(zip([f"{t}:{p}" for t, p in DB_BACKEND], catalog.table_privileges(conn, DB_BACKEND), strict=True))


def choose(setting: str, *, source: str, dialect: str | None, held: Mapping[str, bool] | None) -> Choice:
    """The backend for ``setting`` (auto, api or db); ``held``: the role's grants (None: not read)."""
    if setting != "auto":
        return Choice(setting, None)
    if source == "api":
        return Choice("api", "DUPGUARD_SOURCE=api has no database to write to")
    if dialect != "postgresql":
        return Choice("api", "dupguard opens SQLite read-only")
    missing = lacking(held or {})
    if missing:
        return Choice("api", f"the database role lacks {', '.join(missing)}")
    return Choice("db", None)


def warning(choice: Choice) -> str:
    """The one start-up line when auto could not take db: why, the harm, the way out."""
    out = WAY_OUT if choice.why_not_db and "lacks" in choice.why_not_db else GUARD
    return f"DUPGUARD_REMEDIATION_BACKEND=auto uses api: {choice.why_not_db}; {HARM}; {out}"

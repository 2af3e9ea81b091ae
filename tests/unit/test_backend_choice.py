"""``DUPGUARD_REMEDIATION_BACKEND=auto``: db wherever it can write, else api with the reason said."""

from __future__ import annotations

import pytest

from detector.actions.remediation.choice import DB_BACKEND, Choice, choose, lacking, warning
from detector.config import load
from detector.errors import ConfigError

ALL = {f"{t}:{p}": True for t, p in DB_BACKEND}


def test_auto_takes_db_on_postgres_with_every_grant() -> None:
    assert choose("auto", source="database", dialect="postgresql", held=ALL) == Choice("db", None)


@pytest.mark.parametrize("missing", [f"{t}:{p}" for t, p in DB_BACKEND])
def test_auto_takes_api_when_one_grant_is_missing_and_names_it(missing: str) -> None:
    chosen = choose("auto", source="database", dialect="postgresql", held=ALL | {missing: False})
    table, privilege = missing.split(":")
    assert chosen.backend == "api"
    assert chosen.why_not_db == f"the database role lacks {privilege} on {table}"
    line = warning(chosen)
    assert f"lacks {privilege} on {table}" in line and "apache/airflow#71360" in line
    assert "GRANT" in line and "docs/how-to/guard.md" in line


def test_auto_takes_api_without_a_writable_database() -> None:
    api = choose("auto", source="api", dialect=None, held=None)
    sqlite = choose("auto", source="database", dialect="sqlite", held=ALL)
    assert api.backend == sqlite.backend == "api"
    assert "DUPGUARD_SOURCE=api" in warning(api) and "GRANT" not in warning(api)
    assert "SQLite" in warning(sqlite) and "docs/how-to/guard.md" in warning(sqlite)
    assert choose("auto", source="database", dialect="postgresql", held=None).backend == "api"  # grants unread


def test_an_explicit_backend_is_kept() -> None:
    for backend in ("api", "db"):
        assert choose(backend, source="database", dialect="postgresql", held={}) == Choice(backend, None)


def test_lacking_lists_in_the_grant_order() -> None:
    assert lacking({}) == [f"{p} on {t}" for t, p in DB_BACKEND]
    assert lacking(ALL) == []


def test_auto_is_the_default_and_needs_no_api_settings_where_db_may_do() -> None:
    postgres = {"database_url": "postgresql://u@h/db", "remediation": "fail"}
    assert load(postgres, {}, None).remediation_backend == "auto"  # db may do: decided at start
    with pytest.raises(ConfigError, match="needs DUPGUARD_AIRFLOW_API_URL"):
        load(postgres | {"database_url": "sqlite:////x/airflow.db"}, {}, None)  # auto can only be api there
    with pytest.raises(ConfigError, match="needs DUPGUARD_AIRFLOW_API_URL"):
        load(postgres | {"remediation_backend": "api"}, {}, None)

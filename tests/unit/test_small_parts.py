"""Durations, URL handling and schema-family inference."""

from __future__ import annotations

from datetime import timedelta

import pytest

from detector.durations import parse_duration
from detector.errors import ConfigError, UnsupportedSchema
from detector.metadb.engine import parse_url, redact
from detector.metadb.schema import Family
from detector.metadb.versions import family_from_columns, identify


@pytest.mark.parametrize(
    ("text", "expected"),
    [("90s", 90), ("15m", 900), ("1h30m", 5400), ("1d", 86400), ("0.02s", 0.02), ("500ms", 0.5), ("0", 0)],
)
def test_durations(text: str, expected: float) -> None:
    """Durations in the forms flags and env vars use (a bare 0 is the same in every unit)."""
    assert parse_duration(text) == timedelta(seconds=expected)


@pytest.mark.parametrize("bare", ["10", "0.02", " 10 ", "1e3", "0.5"])
def test_bare_numbers_are_refused(bare: str) -> None:
    """A number without a unit is refused (`--poll-interval 10`, meaning 10 ms like the default,
    was read as 10 s); the error suggests both readings."""
    with pytest.raises(ValueError, match="has no unit") as err:
        parse_duration(bare)
    number = f"{float(bare):g}"  # 1e3 -> 1000
    assert f"{number}ms" in str(err.value) and f"{number}s" in str(err.value)


@pytest.mark.parametrize("bad", ["", "1x", "h", "1h 30m", "-5m"])
def test_bad_durations_are_rejected(bad: str) -> None:
    """Anything else is an error naming the text."""
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(bad)


@pytest.mark.parametrize("scheme", ["postgresql", "postgres", "postgresql+psycopg2"])
def test_postgres_urls_use_psycopg2(scheme: str) -> None:
    """The chart's driverless URLs and postgres:// work."""
    assert parse_url(f"{scheme}://u:p@h:5432/db").drivername == "postgresql+psycopg2"


def test_unsupported_scheme_is_a_config_error() -> None:
    """MySQL is not supported; the error names the scheme and not the password."""
    with pytest.raises(ConfigError) as err:
        parse_url("mysql://user:hunter2@h/db")
    assert "mysql" in str(err.value) and "hunter2" not in str(err.value)


def test_redaction_hides_password_everywhere() -> None:
    """The rendered URL does not show the password (driver messages: tests/unit/test_redact.py)."""
    url = parse_url("postgresql://airflow:s3cr3t-pw@db:5432/airflow")
    assert "s3cr3t-pw" not in redact(url)


@pytest.mark.parametrize(
    ("columns", "family"),
    [
        ({"dag_run": {"execution_date", "run_id"}}, Family.AIRFLOW_2),
        ({"dag_run": {"run_after"}}, Family.AIRFLOW_3_0),
        ({"dag_run": {"run_after", "triggering_user_name"}}, Family.AIRFLOW_3_1),
        ({"dag_run": {"run_after", "partition_key"}, "asset_partition_dag_run": {"id"}}, Family.AIRFLOW_3_2),
        (
            {"dag_run": {"run_after", "partition_key"}, "asset_partition_dag_run": {"partition_date"}},
            Family.AIRFLOW_3_3,
        ),
    ],
)
def test_family_from_columns(columns: dict[str, set[str]], family: Family) -> None:
    """Unknown alembic heads fall back to the columns that distinguish each family."""
    assert family_from_columns(columns) is family


def test_not_an_airflow_database() -> None:
    """No dag_run table: a clear error."""
    with pytest.raises(UnsupportedSchema, match="not an Airflow metadata database"):
        family_from_columns({})


def test_known_head_names_the_exact_version() -> None:
    """A known alembic head names the release; an unknown one is marked inferred."""
    exact = identify("cc92b33c6709", {})
    assert (exact.airflow_version, exact.family, exact.exact) == (">=3.1.0,<3.1.8", Family.AIRFLOW_3_1, True)
    newest = identify("d2f4e1b3c5a7", {})
    assert (newest.airflow_version, newest.family) == (">=3.3.0", Family.AIRFLOW_3_3)
    guess = identify("ffffffffffff", {"dag_run": {"run_after"}})
    assert guess.family is Family.AIRFLOW_3_0 and not guess.exact

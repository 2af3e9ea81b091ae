"""Redaction by parsing: database URLs in every form, HTTP URLs, API error bodies, driver messages."""

from __future__ import annotations

import json

import pytest
from psycopg2.extensions import parse_dsn
from pydantic import BaseModel, ConfigDict, ValidationError
from sqlalchemy.exc import OperationalError

from detector import redact
from detector.airflowapi.client import detail as _detail
from detector.config import Config
from detector.metadb.engine import describe_error, parse_url


@pytest.mark.parametrize(
    ("raw", "secret", "kept"),
    [
        ("postgresql://airflow:Mk1-secret@db:5432/airflow", "Mk1-secret", "airflow:***@db:5432/airflow"),
        ("postgresql://airflow@db/airflow?password=Mk2-secret&sslmode=require", "Mk2-secret", "sslmode=require"),
        ("postgresql://airflow:p@ss-Mk3@db:5432/airflow", "ss-Mk3", "airflow:***@db:5432/airflow"),
        ("postgresql+psycopg2://u:ps@db/airflow", "ps", "postgresql+psycopg2://u:***@db/airflow"),
        ("postgres://u:p@db/a?sslpassword=Mk4-key", "Mk4-key", "postgresql+psycopg2://u:***@db/a?sslpassword=***"),
    ],
)
def test_database_url_forms(raw: str, secret: str, kept: str) -> None:
    """Userinfo and query passwords are masked; a short password does not corrupt the text; an ``@`` in
    the password is split as libpq does, so its tail is neither leaked nor sent to DNS as a host."""
    url = parse_url(raw)
    shown = redact.db_url(url)
    assert not redact.contains_secret(shown, [secret])  # short ones as a token: "ps" is in "psycopg2"
    assert kept in shown
    assert url.host == "db"
    assert not redact.contains_secret(str(Config.of(database_url=raw).redacted()), [secret])


def test_driver_message_with_the_password_is_withheld_not_patched() -> None:
    """A driver text holding the password is withheld whole; one that merely contains its letters is kept."""
    url = parse_url("postgresql+psycopg2://u:ps@127.0.0.1:1/db")
    orig = Exception('connection to server at "127.0.0.1", port 1 failed: Connection refused')
    text = describe_error(OperationalError("SELECT 1", {}, orig), url)
    assert text == (
        'database postgresql+psycopg2://u:***@127.0.0.1:1/db: connection to server at "127.0.0.1", '
        "port 1 failed: Connection refused"
    )
    echoed = Exception("FATAL: password authentication failed, got 'ps'")
    assert "'ps'" not in describe_error(OperationalError("SELECT 1", {}, echoed), url)
    long_url = parse_url("postgresql://u@h/db?password=Mk5-longer")
    echoed = Exception("invalid connection option password=Mk5-longer")
    assert "Mk5-longer" not in describe_error(OperationalError("SELECT 1", {}, echoed), long_url)


def test_web_url_keeps_host_masks_userinfo_and_secret_query() -> None:
    shown = redact.web_url("https://admin:Mk6-pw@airflow.example:8443/api?token=Mk7-tok&x=1")
    assert shown == "https://admin:***@airflow.example:8443/api?token=***&x=1"
    assert redact.http_url("https://hooks.slack.com/services/T0/B0/Mk8") == "https://hooks.slack.com/***"


class _LoginBody(BaseModel):  # the shape of Airflow's simple auth manager LoginBody (extra forbidden)
    model_config = ConfigDict(extra="forbid")
    username: str
    password: str


def test_api_error_bodies_that_echo_the_request() -> None:
    """FastAPI's 422 list (``input`` holds the body) is masked by field; Airflow's ``repr(ValidationError)``
    string (``input_value={'password': ...}``) is withheld because it holds the password."""
    body = {"password": "Mk9-secret-pw"}
    try:
        _LoginBody.model_validate(body)
    except ValidationError as exc:
        fastapi = {"detail": json.loads(exc.json())}
        as_text = {"detail": repr(exc)}
    listed = _detail(json.dumps(fastapi).encode(), ("Mk9-secret-pw",))
    assert "Mk9-secret-pw" not in listed and "missing" in listed and "***" in listed
    assert "Mk9-secret-pw" not in _detail(json.dumps(fastapi).encode())  # masked by parsing alone
    text = _detail(json.dumps(as_text).encode(), ("Mk9-secret-pw",))
    assert "Mk9-secret-pw" not in text and "withheld" in text
    nested = {"detail": {"request": {"username": "admin", "password": "Mk9-secret-pw", "access_token": "Mk10"}}}
    shown = _detail(json.dumps(nested).encode())
    assert "Mk9" not in shown and "Mk10" not in shown and "admin" in shown


# Each form as libpq itself reads it (psycopg2's parse_dsn is libpq's PQconninfoParse): the authority
# ends at the first "/", so "@", "/", ":", "?" and "#" in a ``?password=`` value, and ":", "?", "#" in
# the userinfo password, are the password's; "%XX" is decoded everywhere and "+" stays "+".
LIBPQ_FORMS = [
    "postgresql://airflow@db:5432/airflow?password=Mk9a@tail9",
    "postgresql://airflow@db/airflow?password=Mk9a@tail9&sslmode=disable",
    "postgresql://[::1]:5432/airflow?password=Mk9a@tail9",
    "postgresql://airflow@db/airflow?password=Mk9a+/:?#@tail9",
    "postgresql://airflow:Mk9a:?#tail9@db:5432/airflow",
    "postgresql://airflow:Mk9a%40%2F%3A%3F%23tail9@db/airflow",
    "postgresql://airflow:Mk9a+tail9@db/air%40flow",
]


@pytest.mark.parametrize("raw", LIBPQ_FORMS)
def test_database_url_is_split_where_libpq_splits_it(raw: str) -> None:
    """User, password, host, port and database are what libpq makes of the same text (so the URL
    connects), and no part of the password shows in the redacted URL, the configuration or an error."""
    url = parse_url(raw)
    password = url.query.get("password", url.password)
    ours = {"user": url.username, "password": password, "host": url.host, "port": url.port, "dbname": url.database}
    libpq = parse_dsn(raw)
    libpq["port"] = int(libpq["port"]) if "port" in libpq else None
    assert ours == {key: libpq.get(key) for key in ours}
    error = describe_error(OperationalError("SELECT 1", {}, Exception("connection refused")), url)
    for shown in (redact.db_url(url), str(Config.of(database_url=raw).redacted()), error):
        assert "Mk9a" not in shown and "tail9" not in shown, shown

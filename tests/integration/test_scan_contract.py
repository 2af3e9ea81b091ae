"""`scan --format json` prints one JSON document and `--format csv` its header, whatever happens.

Tools parse stdout: an Airflow 2 database, a database that is unreachable or not Airflow's, a missing
setting and a usage error each still give them a document (and the exit code documented in
docs/reference/cli.md), with the one-line message on stderr.
"""

from __future__ import annotations

import json
import uuid

import pytest

from detector.app.cli import main
from detector.app.render import CSV_COLUMNS
from tests.pg import Templates, database_url, execute_admin

pytestmark = pytest.mark.integration
HEADER = ",".join(CSV_COLUMNS) + "\n"


def _scan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(["scan", *args])
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _document(out: str) -> dict:  # type: ignore[type-arg]
    doc = json.loads(out)  # exactly one document: json.loads rejects anything after it
    assert doc["format_version"] == 1
    assert set(doc) >= {"airflow_version", "summary", "groups", "note", "error", "runs_examined"}
    return doc


def test_airflow_2_prints_a_json_document_and_a_csv_header(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    url = pg_templates.clone("2.10.5")
    code, out, _ = _scan(capsys, "--database-url", url, "--format", "json")
    doc = _document(out)
    assert code == 0
    assert doc["groups"] == [] and doc["error"] is None
    assert "Airflow 2 cannot create duplicate" in doc["note"]
    assert doc["airflow_version"].startswith(">=2.10")
    code, out, _ = _scan(capsys, "--database-url", url, "--format", "csv")
    assert (code, out) == (0, HEADER)


def test_a_database_that_is_not_airflow_exits_3_with_a_document(capsys: pytest.CaptureFixture[str]) -> None:
    name = f"t_{uuid.uuid4().hex[:12]}"
    execute_admin(f'CREATE DATABASE "{name}"')
    try:
        code, out, err = _scan(capsys, "--database-url", database_url(name), "--format", "json")
        doc = _document(out)
        assert code == 3
        assert doc["error"]["exit_code"] == 3 and doc["error"]["message"] in err
        assert doc["groups"] == [] and doc["airflow_version"] is None
        code, out, _ = _scan(capsys, "--database-url", database_url(name), "--format", "csv")
        assert (code, out) == (3, HEADER)
    finally:
        execute_admin(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_an_unreachable_database_exits_3_with_a_document(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql://nobody:secret-pw@127.0.0.1:1/airflow"
    code, out, err = _scan(capsys, "--database-url", url, "--format", "json")
    doc = _document(out)
    assert code == 3 and doc["error"]["exit_code"] == 3
    assert "secret-pw" not in out + err


@pytest.mark.parametrize(
    "args",
    [
        ["--format", "json", "--since", "yesterday-ish"],  # argparse rejects the value
        ["--format=json", "--no-such-flag"],
        ["--format", "json", "--database-url", "mysql://x@h/db"],  # configuration error
    ],
    ids=["bad-since", "unknown-flag", "bad-url"],
)
def test_usage_and_configuration_errors_exit_2_with_a_document(
    args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DUPGUARD_DATABASE_URL", raising=False)
    monkeypatch.delenv("DUPGUARD_DATABASE_URL_FILE", raising=False)
    code, out, err = _scan(capsys, *args)
    doc = _document(out)
    assert code == 2 and doc["error"]["exit_code"] == 2
    assert err.strip()
    code, out, _ = _scan(capsys, *[a.replace("json", "csv") for a in args])
    assert (code, out) == (2, HEADER)


def test_a_clean_scan_document_says_there_was_no_error(
    pg_templates: Templates, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _scan(capsys, "--database-url", pg_templates.clone("3.1.2"), "--format", "json")
    doc = _document(out)
    assert (code, doc["error"], doc["note"], doc["groups"]) == (0, None, None, [])

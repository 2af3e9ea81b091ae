"""The command line end to end on the embedded demo database (SQLite, Airflow 3.1 tables)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from detector.app import demo
from detector.app.cli import main


@pytest.fixture
def demo_db(tmp_path: Path) -> str:
    path = tmp_path / "airflow.db"
    demo.build(path)
    return f"sqlite:///{path}"


def test_demo_prints_groups_and_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`dupguard demo` finds the seeded incident and prints what it would do, exit 0."""
    assert main(["demo", "--db", str(tmp_path / "d.db")]) == 0
    out = capsys.readouterr().out
    assert "6 duplicate group(s): 6 confirmed" in out
    assert "IOcGWY58" in out and "too late, both runs executed" in out
    assert "would mark failed asset_triggered__" in out and "CSaWJHzX" in out
    assert "prevented by the in-scheduler guard" in out


def test_demo_prevented_run_is_listed_as_guard_leaves_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run the plan calls prevented is listed finished, as the guard leaves it (state success, every task
    skipped: docs/how-to/guard.md); it was listed `running` beside "prevented by the in-scheduler guard"."""
    assert main(["demo", "--db", str(tmp_path / "d.db")]) == 0
    out = capsys.readouterr().out
    prevented = [line.split("; leave ")[1].split()[0] for line in out.splitlines() if "prevented by" in line]
    assert len(prevented) == 1
    listed = [line.split() for line in out.splitlines() if prevented[0] in line and "state=" in line]
    assert listed == [["duplicate", prevented[0], "state=success", "job=101", "on", "airflow-scheduler-7d9f-0",
                       "tasks", "started", "0/1"]]  # fmt: skip


def test_scan_json_contract(demo_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON has the documented keys; look-alikes in the demo are not flagged; exit 1 when found."""
    assert main(["scan", "--database-url", demo_db, "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["airflow_version"] == ">=3.1.0,<3.1.8" and doc["format_version"] == 1
    required = {
        "dag_id", "kind", "confidence", "kept_run_id", "duplicate_run_ids", "shared_event_ids",
        "run_after", "partition_key", "creating_job_ids", "duplicate_task_seconds",
    }  # fmt: skip
    for group in doc["groups"]:
        assert required <= group.keys()
    dags = sorted(g["dag_id"] for g in doc["groups"])
    assert dags == sorted(
        ["consumer_asset_listener"] * 2 + ["load_orders", "refresh_dashboard", "notify_finance", "archive_orders"]
    )
    report = next(g for g in doc["groups"] if g["kept_run_id"].endswith("vBRUPZHu"))
    assert report["duplicate_run_ids"][0].endswith("IOcGWY58")
    assert report["creating_job_ids"] == [101, 102]
    assert report["duplicate_task_seconds"] == 8.0
    assert doc["summary"]["duplicate_runs"] == 6


def test_scan_dag_filters_and_since(demo_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--dag/--exclude-dag narrow the DAGs; --since far in the past of the demo finds nothing."""
    main(["scan", "--database-url", demo_db, "--format", "json", "--dag", "*orders*", "--exclude-dag", "archive_*"])
    doc = json.loads(capsys.readouterr().out)
    assert [g["dag_id"] for g in doc["groups"]] == ["load_orders"]
    assert main(["scan", "--database-url", demo_db, "--since", "1h"]) == 0  # the demo incident is in March
    assert "No duplicate asset-triggered runs found." in capsys.readouterr().out


def test_scan_csv_has_one_row_per_group(demo_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """CSV: a header and one row per group."""
    main(["scan", "--database-url", demo_db, "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 6 and {r["confidence"] for r in rows} == {"confirmed"}


def test_unreachable_database_is_one_line_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    """A dead server: exit 3, one line naming the host, no password, no traceback."""
    code = main(["scan", "--database-url", "postgresql://airflow:topsecret@127.0.0.1:1/airflow"])
    err = capsys.readouterr().err
    assert code == 3
    assert "127.0.0.1" in err and "topsecret" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_unsupported_url_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL scheme dupguard cannot read is a configuration error."""
    assert main(["scan", "--database-url", "mysql://u:p@h/db"]) == 2
    assert "not supported" in capsys.readouterr().err


def test_not_airflow_database_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An empty SQLite file is not an Airflow database: exit 3 with a clear message."""
    (tmp_path / "empty.db").touch()
    assert main(["scan", "--database-url", f"sqlite:///{tmp_path / 'empty.db'}"]) == 3
    assert "not an Airflow metadata database" in capsys.readouterr().err


def test_scan_never_creates_or_changes_a_sqlite_file(tmp_path: Path, demo_db: str) -> None:
    """scan opens SQLite read-only: a wrong path is exit 3 and no file appears; a real one is unchanged."""
    missing = tmp_path / "missing.db"
    assert main(["scan", "--database-url", f"sqlite:///{missing}"]) == 3
    assert not missing.exists()
    path = Path(demo_db.removeprefix("sqlite:///"))
    before = path.read_bytes()
    assert main(["scan", "--database-url", demo_db]) == 1
    assert path.read_bytes() == before


def test_demo_replaces_only_its_own_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second demo run at the same path replaces the first demo's file; a user's file is left alone (exit 2)."""
    own = tmp_path / "demo.db"
    assert main(["demo", "--db", str(own)]) == 0
    assert demo.is_demo_db(own)
    assert main(["demo", "--db", str(own)]) == 0
    for content in (b"", b"not sqlite", b"SQLite format 3\x00" + bytes(100)):
        user = tmp_path / "airflow.db"
        user.write_bytes(content)
        capsys.readouterr()
        assert main(["demo", "--db", str(user)]) == 2
        assert "refusing" in capsys.readouterr().err
        assert user.read_bytes() == content


def test_scan_reads_the_database_url_from_env_and_file(
    demo_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """scan, like run, takes DUPGUARD_DATABASE_URL, then DUPGUARD_DATABASE_URL_FILE; the flag wins."""
    monkeypatch.setenv("DUPGUARD_DATABASE_URL", demo_db)
    assert main(["scan", "--format", "json"]) == 1
    monkeypatch.delenv("DUPGUARD_DATABASE_URL")
    secret = tmp_path / "url"
    secret.write_text(demo_db + "\n")
    monkeypatch.setenv("DUPGUARD_DATABASE_URL_FILE", str(secret))
    assert main(["scan", "--format", "json"]) == 1
    assert main(["scan", "--database-url", f"sqlite:///{tmp_path / 'missing.db'}"]) == 3
    monkeypatch.delenv("DUPGUARD_DATABASE_URL_FILE")
    capsys.readouterr()
    assert main(["scan"]) == 2
    assert "DUPGUARD_DATABASE_URL" in capsys.readouterr().err


def test_hostile_ids_are_escaped_in_table_and_csv(demo_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """DAG and run ids carrying terminal escape sequences, a newline and a right-to-left override are
    printed escaped (``\\x1b[2J``) in the table and in CSV cells, never raw."""
    import sqlite3

    hostile_dag = "load_orders\x1b[2J\x1b[H"
    hostile_run_suffix = "\u202eevil\nline"
    conn = sqlite3.connect(demo_db.removeprefix("sqlite:///"))
    with conn:
        conn.execute("UPDATE dag_run SET dag_id = ? WHERE dag_id = 'load_orders'", (hostile_dag,))
        conn.execute("UPDATE task_instance SET dag_id = ? WHERE dag_id = 'load_orders'", (hostile_dag,))
        runs = [r for (r,) in conn.execute("SELECT run_id FROM dag_run WHERE dag_id = ?", (hostile_dag,))]
        for run_id in runs:
            conn.execute("UPDATE dag_run SET run_id = ? WHERE run_id = ?", (run_id + hostile_run_suffix, run_id))
            conn.execute("UPDATE task_instance SET run_id = ? WHERE run_id = ?", (run_id + hostile_run_suffix, run_id))
    conn.close()
    for fmt in ("table", "csv"):
        assert main(["scan", "--database-url", demo_db, "--format", fmt]) == 1
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\u202e" not in out and "evil\nline" not in out
        assert "load_orders\\x1b[2J\\x1b[H" in out and "\\u202eevil\\nline" in out
        if fmt == "csv":
            rows = list(csv.DictReader(io.StringIO(out)))
            assert len(rows) == 6
            assert "load_orders\\x1b[2J\\x1b[H" in {r["dag_id"] for r in rows}
